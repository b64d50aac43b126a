"""``site-train``: runs on a site's own pool, once per job; every federated round is a task inside it."""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger

from insitu.data.loader import load_split
from insitu.federated.rounds import round_name
from tasks.context import SiteContext, site_context
from tasks.train import train_round


@flow(name="site-train", log_prints=False)
def site_train(
    job_id: str,
    dataset: str = "fraud",
    training: str = "fraud",
    overrides: dict[str, Any] | None = None,
    wait_timeout_s: float = 900.0,
) -> dict[str, Any]:
    """Every round of the job: wait for the global weights, train locally, publish the update."""
    logger = get_run_logger()
    ctx = site_context(job_id, training, dataset, overrides)
    t = ctx.conf.training
    norm = ctx.exchange.get_json("stats", "global.json", writer="coordinator")
    x, y = load_split(ctx.store, dataset, job_id, "train")
    ctx.audit.append("data.read", what="prepared/train", job_id=job_id, flow_run_id=ctx.flow_run_id, rows=len(y),
                     strategy=t.strategy, ranks=t.ranks_per_site)
    n_features, pos_weight = len(norm["mean"]), float(norm["pos_weight"])
    done = 0
    for rnd in range(t.rounds):
        name = round_name(rnd)
        if not _wait_for_weights_or_abort(ctx, name, wait_timeout_s):
            raise TimeoutError(f"site {ctx.site}: no global weights for {name} after {wait_timeout_s:.0f}s")
        if ctx.exchange.exists("control", "abort.json", writer="coordinator"):
            reason = ctx.exchange.get_json("control", "abort.json", writer="coordinator").get("reason")
            logger.warning("coordinator aborted job %s after %d rounds here: %s", job_id, done, reason)
            break
        if ctx.exchange.exists("update", f"{name}.manifest.json"):
            logger.info("round %d already published by this site (resumed run); skipping", rnd)
        else:
            train_round(ctx, rnd, n_features, pos_weight)
        done += 1
    return {"site": ctx.site, "rounds": done, "n_samples": int(len(y)), "positives": int(y.sum())}


def _wait_for_weights_or_abort(ctx: SiteContext, name: str, timeout: float, poll: float = 0.5) -> bool:
    """True once the round's global weights or the coordinator's abort marker exist; False on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ctx.exchange.fs.invalidate_cache()
        if ctx.exchange.exists("weights", f"{name}.manifest.json", writer="coordinator") or ctx.exchange.exists(
                "control", "abort.json", writer="coordinator"):
            return True
        time.sleep(poll)
    return False
