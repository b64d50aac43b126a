"""``site-prepare``: runs on a site's own pool; prepares that site's shards on its Dask cluster.

Once its preparation is published the run goes on to train and evaluate the job when the coordinator dispatches
those phases to it (:func:`tasks.site_training.train_when_dispatched`): one flow run per site per job, so a site
pays one process start, one set of imports and one worker pick-up per job, not three.

The site trusts nothing in the run's parameters: its identity comes from its worker's own identity file,
the signed ``request`` is admitted only by the site's own policy, the run must be the one the coordinator
dispatched (``insitu.governance.dispatch``), and the shards it reads are every shard its own datasets.yaml pins to
it for the signed dataset (a ``shards`` parameter that says otherwise is refused).
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from insitu.federated.paths import PREPARE_STATS
from insitu.governance.residency import site_shards
from tasks.anchoring import anchor_site
from tasks.context import site_context
from tasks.prepare import prepare_shards
from tasks.site_training import train_when_dispatched


@flow(name="site-prepare", log_prints=False)
def site_prepare(
    job_id: str,
    dataset: str = "fraud",
    shards: list[str] | None = None,
    training: str = "fraud",
    overrides: dict[str, Any] | None = None,
    request: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Validate, quarantine, featurize and split this site's shards on its Dask cluster; then train and evaluate
    when the coordinator dispatches those phases to this run.

    Publishes only aggregate statistics (counts, sums, sums of squares) to the exchange.
    """
    logger = get_run_logger()
    context = site_context(job_id, training, dataset, overrides, request, "prepare", {"shards": shards})
    admitted = site_shards(context.site, shards, dataset, context.conf.dataset, context.audit, context.principal,
                            job_id, context.flow_run_id)
    logger.info("site=%s admitted %d shard(s): %s", context.site, len(admitted), [shard.id for shard in admitted])
    summary = prepare_shards(context, admitted, job_id)
    summary["site"] = context.site
    summary["ran_as"] = context.ran_as
    summary["flow_run_id"] = context.flow_run_id
    context.exchange.put_json(PREPARE_STATS, summary)
    logger.info("site=%s prepared %d rows, quarantined %d, unreadable shards %s", context.site,
                summary["rows_prepared"], summary["rows_quarantined"], summary["shards_unreadable"])
    anchor_site(context.audit, context.exchange.store, context.site, job_id, "prepare")
    prepared = {k: summary[k] for k in ("rows_prepared", "rows_quarantined", "shards_unreadable")}
    return {**prepared, "trained": train_when_dispatched(context)}
