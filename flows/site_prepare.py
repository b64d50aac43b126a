"""``site-prepare``: runs on a site's own pool; prepares that site's shards on its Dask cluster.

The site trusts nothing in the run's parameters: its identity comes from its worker's own identity file,
the signed ``request`` is admitted only by the site's own policy, and its guard re-checks every requested
shard against its own datasets.yaml.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from insitu.federated.paths import PREPARE_STATS
from insitu.governance.residency import admit_shards
from tasks.anchoring import anchor_site
from tasks.context import site_context
from tasks.prepare import prepare_shards


@flow(name="site-prepare", log_prints=False)
def site_prepare(
    job_id: str,
    dataset: str = "fraud",
    shards: list[str] | None = None,
    training: str = "fraud",
    overrides: dict[str, Any] | None = None,
    request: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Validate, quarantine, featurize and split this site's shards on its Dask cluster.

    Publishes only aggregate statistics (counts, sums, sums of squares) to the exchange.
    """
    logger = get_run_logger()
    ctx = site_context(job_id, training, dataset, overrides, request, "prepare")
    admitted = admit_shards(ctx.site, shards, dataset, ctx.conf.dataset, ctx.audit, ctx.principal, job_id,
                            ctx.flow_run_id)
    logger.info("site=%s admitted %d shard(s): %s", ctx.site, len(admitted), [s.id for s in admitted])
    summary = prepare_shards(ctx, admitted, job_id)
    summary["site"] = ctx.site
    summary["ran_as"] = ctx.ran_as
    ctx.exchange.put_json(PREPARE_STATS, summary)
    logger.info("site=%s prepared %d rows, quarantined %d, unreadable shards %s", ctx.site,
                summary["rows_prepared"], summary["rows_quarantined"], summary["shards_unreadable"])
    anchor_site(ctx.audit, ctx.exchange.store, ctx.site, job_id, "prepare")
    return {k: summary[k] for k in ("rows_prepared", "rows_quarantined", "shards_unreadable")}
