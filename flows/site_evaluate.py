"""``site-evaluate``: runs on a site's own pool; scores global models on the site's own test split."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from insitu.data.loader import load_split
from insitu.federated.rounds import round_name
from tasks.anchoring import anchor_site
from tasks.context import site_context
from tasks.evaluate import evaluate_weights


@flow(name="site-evaluate", log_prints=False)
def site_evaluate(
    job_id: str,
    weights: list[str],
    dataset: str = "fraud",
    training: str = "fraud",
    overrides: dict[str, Any] | None = None,
    request: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Score each named global model on this site's test split; publish metrics (never scores)."""
    logger = get_run_logger()
    ctx = site_context(job_id, training, dataset, overrides, request, "evaluate")
    # Only the job's final model and the champion are scored: a coordinator may not use the site's test rows
    # as an oracle for weights of its choosing.
    allowed = {round_name(ctx.conf.training.rounds), "champion"}
    if not weights or not set(weights) <= allowed:
        reason = (f"site {ctx.site!r} scores only {sorted(allowed)} for job {job_id}, not "
                  f"{[w[:40] for w in weights][:5]}; rule evaluate.final-or-champion")
        ctx.audit.append("evaluate.refused", job_id=job_id, flow_run_id=ctx.flow_run_id,
                         rule="evaluate.final-or-champion", reason=reason)
        raise PermissionError(reason)
    norm = ctx.exchange.get_json("stats", "global.json", writer="coordinator")
    x, y = load_split(ctx.store, dataset, job_id, "test")
    ctx.audit.append("data.read", what="prepared/test", job_id=job_id, flow_run_id=ctx.flow_run_id, rows=len(y))
    results = {}
    for name in weights:
        results[name] = evaluate_weights(ctx, name, x, y, norm)
        logger.info("site=%s model=%s %s", ctx.site, name,
                    " ".join(f"{k}={v:.4f}" for k, v in results[name].items() if isinstance(v, float)))
    ctx.exchange.put_json("metrics", "evaluate.json", {"site": ctx.site, "ran_as": ctx.ran_as, "models": results})
    anchor_site(ctx.audit, ctx.exchange.store, ctx.site, job_id, "evaluate")
    return results
