"""A site's evaluation of a job: score the models the coordinator names on the site's own test split, publish the
metrics (never a score). It runs in the site's one run of the job (its ``site-prepare`` run, or a ``site-train``
run) once its rounds are over and the coordinator dispatches the evaluation to that run
(:func:`evaluate_when_dispatched`), or in a ``site-evaluate`` run of its own when that run is no longer there."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger

from insitu.data.loader import load_split
from insitu.federated.kinds import COORDINATOR
from insitu.federated.paths import EVALUATION, GLOBAL_STATS
from insitu.federated.site_rounds import wait_for_dispatch
from insitu.governance.evaluation import RULE, evaluation_refusal, scored_global_model
from tasks.anchoring import anchor_site
from tasks.context import SiteContext, admit_next_phase
from tasks.evaluate import bind_evaluation, evaluate_weights, evaluation_binding, validated_rounds


def evaluate_here(context: SiteContext, weights: list[str]) -> dict[str, Any]:
    """Score each named global model on this site's test split (the site's context admitted for ``evaluate``).

    The site scores only what the rule :mod:`insitu.governance.evaluation` admits: one global model of the job
    that it validated (the first one it scores binds the job) and the champion.
    """
    logger, job_id = get_run_logger(), context.exchange.job_id
    bound = evaluation_binding(context.store, job_id)
    validated = validated_rounds(context.exchange, context.conf.training.rounds)
    refusal = evaluation_refusal(weights, context.conf.training.rounds, validated, bound)
    if refusal:
        reason = f"site {context.site!r} refuses to score {[w[:40] for w in weights][:5]} for job {job_id}: {refusal}"
        context.audit.append("evaluate.refused", job_id=job_id, flow_run_id=context.flow_run_id, rule=RULE,
                             reason=reason)
        raise PermissionError(f"{reason}; rule {RULE}")
    if bound is None:  # the first evaluation of the job binds it to the model it scores
        bind_evaluation(context.store, job_id, str(scored_global_model(weights)))
    global_stats = context.exchange.get_json(GLOBAL_STATS, writer=COORDINATOR)
    x, y = load_split(context.store, context.conf.dataset_name, job_id, "test")
    context.audit.append("data.read", what="prepared/test", job_id=job_id, flow_run_id=context.flow_run_id,
                         rows=len(y))
    results = {}
    for name in weights:
        results[name] = evaluate_weights(context, name, x, y, global_stats)
        logger.info("site=%s model=%s %s", context.site, name,
                    " ".join(f"{k}={v:.4f}" for k, v in results[name].items() if isinstance(v, float)))
    context.exchange.put_json(EVALUATION, {"site": context.site, "ran_as": context.ran_as, "models": results,
                                           "flow_run_id": context.flow_run_id})
    anchor_site(context.audit, context.exchange.store, context.site, job_id, "evaluate")
    return results


def evaluate_when_dispatched(context: SiteContext, wait_timeout_s: float) -> dict[str, Any] | None:
    """After its rounds, a site's run waits for the coordinator to dispatch the job's evaluation to it
    (a dispatch naming this run and the models to score), admits it as a run started for it would be, and
    evaluates. None when the job failed instead (the abort marker), or the coordinator dispatched the training
    alone (its dispatch does not say ``goes_on``).

    Raises
    ------
    TimeoutError
        When the coordinator dispatched nothing to this run within ``wait_timeout_s``.
    """
    if not context.dispatch.get("goes_on"):  # dispatched alone: the run ends with its rounds
        return None
    record = wait_for_dispatch(context.exchange, "evaluate", context.flow_run_id, wait_timeout_s)
    if record is None:
        get_run_logger().warning("site=%s: job %s was aborted before its evaluation", context.site,
                                 context.exchange.job_id)
        return None
    weights = list(record["parameters"].get("weights") or [])
    return evaluate_here(admit_next_phase(context, "evaluate", {"weights": weights}), weights)
