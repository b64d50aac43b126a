"""``site-train``: runs on a site's own pool, once per job; every federated round is a task inside it, and so is
the site's evaluation of the job, once the coordinator dispatches it to this run.

The round protocol (what to wait for, when to validate, train, skip or stop) is the core's:
:func:`insitu.federated.site_rounds.run_site_rounds` and, in async mode,
:func:`insitu.federated.asynchronous.site.run_site_updates`. This flow hands them the site's tasks. Evaluating in
the same run spares each site a second flow run (its process start, imports and checks) per job; the evaluation
is admitted as a run of its own would be (:func:`tasks.site_evaluation.evaluate_when_dispatched`).
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from insitu.federated.asynchronous import update_limit
from insitu.federated.asynchronous.site import run_site_updates
from insitu.federated.kinds import COORDINATOR
from insitu.federated.paths import GLOBAL_STATS
from insitu.federated.site_rounds import run_site_rounds
from tasks.anchoring import anchor_site
from tasks.context import site_context
from tasks.evaluate import validator
from tasks.site_evaluation import evaluate_when_dispatched
from tasks.train import train_async_update, train_round


@flow(name="site-train", log_prints=False)
def site_train(
    job_id: str,
    dataset: str = "fraud",
    training: str = "fraud",
    overrides: dict[str, Any] | None = None,
    request: dict[str, Any] | None = None,
    wait_timeout_s: float = 900.0,
) -> dict[str, Any]:
    """Every round of the job: wait for the global weights, train locally, publish the update; then score the
    models the coordinator dispatches for the job's evaluation."""
    logger = get_run_logger()
    context = site_context(job_id, training, dataset, overrides, request, "train", {"wait_timeout_s": wait_timeout_s})
    training_config = context.conf.training
    global_stats = context.exchange.get_json(GLOBAL_STATS, writer=COORDINATOR)
    validate = validator(context, global_stats)  # None: this site has no validation rows
    if training_config.federation.mode == "async":
        limit = update_limit(training_config)
        assert limit is not None, "an async job bounds each site's updates"
        pushed = run_site_updates(
            context.exchange, limit, train=lambda seq, version: train_async_update(context, seq, version, global_stats),
            validate=validate, wait_timeout_s=wait_timeout_s, logger=logger)
        anchor_site(context.audit, context.exchange.store, context.site, job_id, "train")
        evaluated = evaluate_when_dispatched(context, wait_timeout_s)
        return {"site": context.site, "updates": pushed, "evaluated": evaluated is not None}
    trained = run_site_rounds(
        context.exchange, training_config.rounds, train=lambda rnd: train_round(context, rnd, global_stats),
        validate=validate, wait_timeout_s=wait_timeout_s, logger=logger)
    anchor_site(context.audit, context.exchange.store, context.site, job_id, "train")
    evaluated = evaluate_when_dispatched(context, wait_timeout_s)
    return {"site": context.site, "rounds": trained, "evaluated": evaluated is not None}
