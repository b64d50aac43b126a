"""``site-evaluate``: runs on a site's own pool; scores global models on the site's own test split."""

from __future__ import annotations

import json
from typing import Any

from prefect import flow, get_run_logger

from insitu.data.loader import load_split
from insitu.federated.kinds import COORDINATOR
from insitu.federated.paths import CHAMPION, EVALUATION, GLOBAL_STATS, round_name, validation
from tasks.anchoring import anchor_site
from tasks.context import SiteContext, site_context
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
    refusal = evaluation_refusal(ctx, job_id, weights)
    if refusal:
        reason = f"site {ctx.site!r} refuses to score {[w[:40] for w in weights][:5]} for job {job_id}: {refusal}"
        ctx.audit.append("evaluate.refused", job_id=job_id, flow_run_id=ctx.flow_run_id,
                         rule="evaluate.one-selected-round", reason=reason)
        raise PermissionError(f"{reason}; rule evaluate.one-selected-round")
    norm = ctx.exchange.get_json(GLOBAL_STATS, writer=COORDINATOR)
    x, y = load_split(ctx.store, dataset, job_id, "test")
    ctx.audit.append("data.read", what="prepared/test", job_id=job_id, flow_run_id=ctx.flow_run_id, rows=len(y))
    results = {}
    for name in weights:
        results[name] = evaluate_weights(ctx, name, x, y, norm)
        logger.info("site=%s model=%s %s", ctx.site, name,
                    " ".join(f"{k}={v:.4f}" for k, v in results[name].items() if isinstance(v, float)))
    ctx.exchange.put_json(EVALUATION, {"site": ctx.site, "ran_as": ctx.ran_as, "models": results})
    anchor_site(ctx.audit, ctx.exchange.store, ctx.site, job_id, "evaluate")
    return results


def evaluation_refusal(ctx: SiteContext, job_id: str, weights: list[str]) -> str | None:
    """Why this site will not score ``weights`` on its test rows (None: it will).

    A coordinator may not use a site's test rows as an oracle for weights of its choosing. So a site scores,
    per job, one global model and the champion: a round of the job that this site validated itself (it
    published that round's validation, so the round's model came out of this job's training), or the last
    round when it has no validation rows. The first round it scores is bound to the job in the site's own
    store; any other round is refused afterwards.
    """
    rounds = ctx.conf.training.rounds
    models = [w for w in weights if w != CHAMPION.name]
    if not weights or len(models) != 1 or len(weights) != len(set(weights)):
        return "a job's evaluation scores exactly one global model of the job (and at most the champion)"
    (name,) = models
    known = {round_name(r): r for r in range(rounds + 1)}
    if name not in known:
        return f"{name[:40]!r} is not a global model of this job (rounds 0 to {rounds})"
    validated = [r for r in range(rounds + 1) if ctx.exchange.exists(validation(r))]
    if validated and known[name] not in validated:
        return f"this site did not validate {name} during the job (it validated rounds {validated[:3]}…)"
    if not validated and known[name] != rounds:
        return f"this site has no validation of the job's rounds, so only the last one, {round_name(rounds)}"
    key = f"evaluations/{job_id}.json"
    try:
        with ctx.store.fs.open(ctx.store.path(key), "rb") as f:
            bound = json.loads(f.read())["model"]
    except FileNotFoundError:
        ctx.store.write_bytes(key, json.dumps({"model": name}).encode())
        return None
    return None if bound == name else f"this job's evaluation is bound to {bound} (scored first), not {name}"
