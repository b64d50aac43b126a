"""``site-train``: runs on a site's own pool, once per job; every federated round is a task inside it."""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger

from insitu.federated.kinds import COORDINATOR, async_update_limit
from insitu.federated.paths import (
    ABORT,
    ASYNC_STATE,
    GLOBAL_STATS,
    NEWEST,
    STOP,
    async_update,
    global_weights,
    refresh,
    update,
    validation,
)
from tasks.anchoring import anchor_site
from tasks.context import SiteContext, site_context
from tasks.evaluate import validate_round
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
    """Every round of the job: wait for the global weights, train locally, publish the update."""
    logger = get_run_logger()
    ctx = site_context(job_id, training, dataset, overrides, request, "train")
    t = ctx.conf.training
    norm = ctx.exchange.get_json(GLOBAL_STATS, writer=COORDINATOR)
    val = validation_rows(ctx)
    if t.federation.mode == "async":
        done = train_async(ctx, norm, val, wait_timeout_s)
        anchor_site(ctx.audit, ctx.exchange.store, ctx.site, job_id, "train")
        return {"site": ctx.site, "updates": done}
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


def train_async(ctx: SiteContext, norm: dict[str, Any], val: tuple[Any, Any] | None, wait_timeout_s: float) -> int:
    """Async mode: pull the newest global version, validate it (once per version), train, push; repeat until
    the coordinator reaches its target version or aborts. Returns the number of updates pushed by this run."""
    logger = get_run_logger()
    ex, t = ctx.exchange, ctx.conf.training
    a = t.federation.asynchronous
    limit = async_update_limit(t.rounds, a.buffer_size if a.algorithm == "fedbuff" else 1)
    seq = next_async_seq(ctx)  # a re-run of the job continues this site's numbering
    pushed, refusals_seen = 0, -1
    while True:
        if pushed:  # one update in flight per site: the next one trains from the version its decision made
            wait_for_decision(ctx, seq - 1, wait_timeout_s)
        waited = [(NEWEST, COORDINATOR), (ABORT, COORDINATOR)]
        if ex.wait_for_any(waited, wait_timeout_s) is None:
            raise TimeoutError(f"site {ctx.site}: no global version published after {wait_timeout_s:.0f}s")
        if ex.exists(ABORT, writer=COORDINATOR):
            reason = ex.get_json(ABORT, writer=COORDINATOR).get("reason")
            logger.warning("coordinator aborted job %s after %d update(s) here: %s", ctx.exchange.job_id, pushed,
                           reason)
            break
        newest = ex.get_json(NEWEST, writer=COORDINATOR)
        version = newest["version"]
        # Per-version validation: the versions this site pulls (always the final one) are scored on its
        # validation split, so the final model's evaluation and gate work as in sync mode.
        if val is not None and not ex.exists(validation(version)):
            validate_round(ctx, version, val[0], val[1], norm)
        if version >= newest["target"]:
            logger.info("version %d reached: site %s stops after %d update(s)", version, ctx.site, pushed)
            break
        refusals_seen = note_refusal(ctx, refusals_seen)
        if seq >= limit:  # the protocol's bound: wait for the target version (and validate it), push no more
            logger.warning("site %s pushed its %d updates (the limit of this job); waiting for the final version",
                           ctx.site, limit)
            ex.wait_for_any([(ABORT, COORDINATOR)], timeout=1.0)
            continue
        train_async_update(ctx, seq, version, norm)
        seq, pushed = seq + 1, pushed + 1
    return pushed


def wait_for_decision(ctx: SiteContext, seq: int, timeout_s: float, poll_s: float = 0.3) -> None:
    """Wait until the coordinator decided this site's update ``seq`` (applied, buffered or refused), the job
    reached its target version, or it was aborted; after ``timeout_s`` go on anyway.

    Without it a site that trains faster than the coordinator decides queues updates that are stale by the time
    they are read (measured on the local platform: most of them refused, the coordinator a queue behind).
    """
    ex = ctx.exchange
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ex.exists(ABORT, writer=COORDINATOR):
            return
        newest = ex.get_json(NEWEST, writer=COORDINATOR)
        if newest["version"] >= newest["target"]:
            return
        if ex.exists(ASYNC_STATE, writer=COORDINATOR):
            state = ex.get_json(ASYNC_STATE, writer=COORDINATOR)
            # Decided, and the newest pointer caught up with the state: the coordinator writes the state before
            # the pointer, so a site that pulled in between would retrain from the version its update replaced
            # (and, at a low max_staleness, be refused for it).
            if state["next_seq"].get(ctx.site, 0) > seq and newest["version"] >= state["version"]:
                return
        time.sleep(poll_s)


def next_async_seq(ctx: SiteContext) -> int:
    """The sequence number of this site's next update: one past the last it published in this job.

    Found by asking for each in turn (a site publishes them in order, so the first missing one is next), not by
    listing: a site's credential may read its own objects on the exchange but not list the bucket.
    """
    seq = 0
    while ctx.exchange.exists(async_update(seq).manifest):
        seq += 1
    return seq


def note_refusal(ctx: SiteContext, seen: int) -> int:
    """Log the coordinator's newest refusal of this site's updates (once); returns the seq it was about.

    Nothing else to do about it: the site pulls the newest version before it trains again anyway.
    """
    if not ctx.exchange.exists(refresh(ctx.site), writer=COORDINATOR):
        return seen
    notice = ctx.exchange.get_json(refresh(ctx.site), writer=COORDINATOR)
    if notice["seq"] != seen:
        get_run_logger().warning("site %s: update %d was refused by the coordinator (%s); refreshing to version %d",
                                 ctx.site, notice["seq"], notice["reason"], notice["version"])
    return int(notice["seq"])


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
