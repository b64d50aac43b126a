"""``site-train``: runs on a site's own pool, once per job; every federated round is a task inside it."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from insitu.federated.rounds import round_name
from tasks.anchoring import anchor_site
from tasks.context import site_context
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
    norm = ctx.exchange.get_json("stats", "global.json", writer="coordinator")
    done = 0
    for rnd in range(t.rounds):
        name = round_name(rnd)
        weights = ("weights", f"{name}.manifest.json", "coordinator")
        abort = ("control", "abort.json", "coordinator")
        if ctx.exchange.wait_for_any([weights, abort], wait_timeout_s) is None:
            raise TimeoutError(f"site {ctx.site}: no global weights for {name} after {wait_timeout_s:.0f}s")
        if ctx.exchange.exists("control", "abort.json", writer="coordinator"):
            reason = ctx.exchange.get_json("control", "abort.json", writer="coordinator").get("reason")
            logger.warning("coordinator aborted job %s after %d rounds here: %s", job_id, done, reason)
            break
        if ctx.exchange.exists("update", f"{name}.manifest.json"):
            logger.info("round %d already published by this site (resumed run); skipping", rnd)
        else:
            train_round(ctx, rnd, norm)
        done += 1
    anchor_site(ctx.audit, ctx.exchange.store, ctx.site, job_id, "train")
    return {"site": ctx.site, "rounds": done}

