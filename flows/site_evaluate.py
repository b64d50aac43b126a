"""``site-evaluate``: runs on a site's own pool; scores global models on the site's own test split."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from insitu.data.loader import load_split
from insitu.federated.kinds import COORDINATOR
from insitu.federated.paths import EVALUATION, GLOBAL_STATS
from insitu.governance.evaluation import RULE, evaluation_refusal, scored_global_model
from tasks.anchoring import anchor_site
from tasks.context import site_context
from tasks.evaluate import bind_evaluation, evaluate_weights, evaluation_binding, validated_rounds


@flow(name="site-evaluate", log_prints=False)
def site_evaluate(
    job_id: str,
    weights: list[str],
    dataset: str = "fraud",
    training: str = "fraud",
    overrides: dict[str, Any] | None = None,
    request: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Score each named global model on this site's test split; publish metrics (never scores).

    The site scores only what the rule :mod:`insitu.governance.evaluation` admits: one global model of the job
    that it validated (the first one it scores binds the job) and the champion.
    """
    logger = get_run_logger()
    context = site_context(job_id, training, dataset, overrides, request, "evaluate", {"weights": weights})
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
    x, y = load_split(context.store, dataset, job_id, "test")
    context.audit.append("data.read", what="prepared/test", job_id=job_id, flow_run_id=context.flow_run_id,
                         rows=len(y))
    results = {}
    for name in weights:
        results[name] = evaluate_weights(context, name, x, y, global_stats)
        logger.info("site=%s model=%s %s", context.site, name,
                    " ".join(f"{k}={v:.4f}" for k, v in results[name].items() if isinstance(v, float)))
    context.exchange.put_json(EVALUATION, {"site": context.site, "ran_as": context.ran_as, "models": results})
    anchor_site(context.audit, context.exchange.store, context.site, job_id, "evaluate")
    return results
