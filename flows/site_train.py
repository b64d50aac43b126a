"""``site-train``: runs on a site's own pool, once per job; every federated round is a task inside it."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from insitu.federated.kinds import COORDINATOR
from insitu.federated.paths import ABORT, GLOBAL_STATS, STOP, global_weights, update, validation
from tasks.anchoring import anchor_site
from tasks.context import SiteContext, site_context
from tasks.evaluate import validate_round
from tasks.train import train_round


@flow(name="site-train", log_prints=False)
def site_train(
    job_id: str,
    dataset: str = "fraud",
    training: str = "fraud",
    overrides: dict[str, Any] | None = None,
    request: dict[str, Any] | None = None,
    wait_timeout_s: float = 900.0,
) -> dict[str, Any]:
    """Every round of the job: wait for the global weights, train locally, publish the update."""
    logger = get_run_logger()
    ctx = site_context(job_id, training, dataset, overrides, request, "train")
    t = ctx.conf.training
    norm = ctx.exchange.get_json(GLOBAL_STATS, writer=COORDINATOR)
    val = validation_rows(ctx)
    done = 0
    # Round r: validate global model r (the one trained from), then train it; the last global model is only
    # validated. The coordinator combines the validations into its early-stopping and selection decisions.
    for rnd in range(t.rounds + 1):
        weights = global_weights(rnd)
        waited = [(weights.manifest, COORDINATOR), (ABORT, COORDINATOR), (STOP, COORDINATOR)]
        if ctx.exchange.wait_for_any(waited, wait_timeout_s) is None:
            raise TimeoutError(f"site {ctx.site}: no global weights for {weights.name} after {wait_timeout_s:.0f}s")
        if ctx.exchange.exists(ABORT, writer=COORDINATOR):
            reason = ctx.exchange.get_json(ABORT, writer=COORDINATOR).get("reason")
            logger.warning("coordinator aborted job %s after %d rounds here: %s", job_id, done, reason)
            break
        if ctx.exchange.exists(STOP, writer=COORDINATOR):
            reason = ctx.exchange.get_json(STOP, writer=COORDINATOR).get("reason")
            logger.info("coordinator stopped job %s early after %d rounds here: %s", job_id, done, reason)
            break
        if val is not None and not ctx.exchange.exists(validation(rnd)):
            validate_round(ctx, rnd, val[0], val[1], norm)
        if rnd == t.rounds:
            break
        if ctx.exchange.exists(update(rnd).manifest):
            logger.info("round %d already published by this site (resumed run); skipping", rnd)
        else:
            train_round(ctx, rnd, norm)
        done += 1
    anchor_site(ctx.audit, ctx.exchange.store, ctx.site, job_id, "train")
    return {"site": ctx.site, "rounds": done}



def validation_rows(ctx: SiteContext) -> tuple[Any, Any] | None:
    """This site's validation split, or None when it has none (``split.val: 0``, or no rows landed there)."""
    from insitu.data.loader import load_split

    try:
        x, y = load_split(ctx.store, ctx.conf.dataset_name, ctx.exchange.job_id, "val")
    except (FileNotFoundError, ValueError):
        get_run_logger().info("site %s has no validation rows for job %s: it publishes no validation", ctx.site,
                              ctx.exchange.job_id)
        return None
    ctx.audit.append("data.read", what="prepared/val", job_id=ctx.exchange.job_id, flow_run_id=ctx.flow_run_id,
                     rows=len(y))
    return x, y
