"""A site's part of the job's training: every round (or async update) as a task, then the job's evaluation when the
coordinator dispatches it to the same run. It runs in the site's ``site-prepare`` run once its preparation is
published and the coordinator dispatches training to that run (:func:`train_when_dispatched`: one flow run per site
per job), or in a ``site-train`` run of its own (a resumed job whose preparation is reused, or a site whose prepare
run had ended).

The round protocol (what to wait for, when to validate, train, skip or stop) is the core's:
:func:`insitu.federated.site_rounds.run_site_rounds` and, in async mode,
:func:`insitu.federated.asynchronous.site.run_site_updates`; this hands them the site's tasks.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger

from insitu.federated.asynchronous import update_limit
from insitu.federated.asynchronous.site import run_site_updates
from insitu.federated.kinds import COORDINATOR
from insitu.federated.paths import GLOBAL_STATS
from insitu.federated.site_rounds import SITE_WAIT_MARGIN_S, run_site_rounds, wait_for_dispatch
from tasks.anchoring import anchor_site
from tasks.context import SiteContext, admit_next_phase
from tasks.evaluate import validator
from tasks.site_evaluation import evaluate_when_dispatched
from tasks.train import train_async_update, train_round


def train_here(context: SiteContext, wait_timeout_s: float) -> dict[str, Any]:
    """Every round of the job on this site (its context admitted for ``train``), then its evaluation."""
    logger, job_id, training_config = get_run_logger(), context.exchange.job_id, context.conf.training
    global_stats = context.exchange.get_json(GLOBAL_STATS, writer=COORDINATOR)
    validate = validator(context, global_stats)  # None: this site has no validation rows
    if training_config.federation.mode == "async":
        limit = update_limit(training_config)
        assert limit is not None, "an async job bounds each site's updates"
        pushed = run_site_updates(
            context.exchange, limit,
            train=lambda seq, version, validated: train_async_update(context, seq, version, global_stats, validated),
            validate=validate, wait_timeout_s=wait_timeout_s, logger=logger)
        done: dict[str, Any] = {"updates": pushed}
    else:
        done = {"rounds": run_site_rounds(
            context.exchange, training_config.rounds,
            train=lambda rnd, validated: train_round(context, rnd, global_stats, validated),
            validate=validate, wait_timeout_s=wait_timeout_s, logger=logger)}
    anchor_site(context.audit, context.exchange.store, context.site, job_id, "train")
    evaluated = evaluate_when_dispatched(context, wait_timeout_s)
    return {"site": context.site, **done, "evaluated": evaluated is not None}


def train_when_dispatched(context: SiteContext) -> dict[str, Any] | None:
    """After publishing its preparation, a site's prepare run waits for the coordinator to dispatch the job's
    training to it (naming this run), admits it as a ``site-train`` run would be admitted, and trains. None when
    the job failed first (the abort marker), or the coordinator dispatched the preparation alone (its dispatch does
    not say ``goes_on``); a site left out is cancelled by the coordinator.

    Raises
    ------
    TimeoutError
        When nothing was dispatched to this run within the job's preparation deadline and a margin (the
        coordinator waits for the slowest site's preparation up to that deadline before it dispatches).
    """
    if not context.dispatch.get("goes_on"):  # dispatched alone (not as the first phase of a job's one run)
        return None
    wait_s = context.conf.training.federation.prepare_deadline_s + SITE_WAIT_MARGIN_S
    record = wait_for_dispatch(context.exchange, "train", context.flow_run_id, wait_s)
    if record is None:
        get_run_logger().warning("site=%s: job %s was aborted before its training", context.site,
                                 context.exchange.job_id)
        return None
    wait_timeout_s = float(record["parameters"]["wait_timeout_s"])
    return train_here(admit_next_phase(context, "train", {"wait_timeout_s": wait_timeout_s}), wait_timeout_s)
