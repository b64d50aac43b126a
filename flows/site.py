"""Flows that run on a site's own work pool, next to its data: prepare, train (all rounds), evaluate.

Each is deployed once per site (``site-prepare/eu`` …). The site trusts nothing in the request about
residency: its identity comes from its worker's environment and its guard re-checks every shard.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from insitu.data.loader import load_split
from insitu.governance.residency import admit_shards
from tasks.context import site_context
from tasks.evaluate import evaluate_weights
from tasks.prepare import prepare_shards
from tasks.train import round_name, train_round


@flow(name="site-prepare", log_prints=False)
def site_prepare(
    job_id: str,
    dataset: str = "fraud",
    shards: list[str] | None = None,
    training: str = "fraud",
    overrides: dict[str, Any] | None = None,
    requested_by: str = "coordinator",
) -> dict[str, Any]:
    """Validate, quarantine, featurize and split this site's shards on its Dask cluster.

    Publishes only aggregate statistics (counts, sums, sums of squares) to the exchange.
    """
    logger = get_run_logger()
    ctx = site_context(job_id, training, dataset, overrides)
    admitted = admit_shards(ctx.site, shards, dataset, ctx.conf.dataset, ctx.audit, requested_by, job_id,
                            ctx.flow_run_id)
    logger.info("site=%s admitted %d shard(s): %s", ctx.site, len(admitted), [s.id for s in admitted])
    summary = prepare_shards(ctx, admitted, job_id)
    summary["site"] = ctx.site
    ctx.exchange.put_json("stats", "prepare.json", summary)
    logger.info("site=%s prepared %d rows, quarantined %d, unreadable shards %s", ctx.site,
                summary["rows_prepared"], summary["rows_quarantined"], summary["shards_unreadable"])
    return {k: summary[k] for k in ("rows_prepared", "rows_quarantined", "shards_unreadable")}


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
    ctx.audit.append("data.read", what="prepared/train", job_id=job_id, flow_run_id=ctx.flow_run_id, rows=len(y))
    n_features, pos_weight = len(norm["mean"]), float(norm["pos_weight"])
    done = 0
    for rnd in range(t.rounds):
        name = round_name(rnd)
        if not ctx.exchange.wait_for("weights", f"{name}.manifest.json", writer="coordinator",
                                     timeout=wait_timeout_s):
            raise TimeoutError(f"site {ctx.site}: no global weights for {name} after {wait_timeout_s:.0f}s")
        if ctx.exchange.exists("control", "abort.json", writer="coordinator"):
            logger.warning("coordinator aborted job %s; stopping after %d rounds", job_id, done)
            break
        if ctx.exchange.exists("update", f"{name}.manifest.json"):
            logger.info("round %d already published by this site (resumed run); skipping", rnd)
        else:
            train_round(ctx, rnd, x, y, n_features, pos_weight)
        done += 1
    return {"site": ctx.site, "rounds": done, "n_samples": int(len(y)), "positives": int(y.sum())}


@flow(name="site-evaluate", log_prints=False)
def site_evaluate(
    job_id: str,
    weights: list[str],
    dataset: str = "fraud",
    training: str = "fraud",
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Score each named global model on this site's test split; publish metrics (never scores)."""
    logger = get_run_logger()
    ctx = site_context(job_id, training, dataset, overrides)
    norm = ctx.exchange.get_json("stats", "global.json", writer="coordinator")
    x, y = load_split(ctx.store, dataset, job_id, "test")
    ctx.audit.append("data.read", what="prepared/test", job_id=job_id, flow_run_id=ctx.flow_run_id, rows=len(y))
    results = {}
    for name in weights:
        results[name] = evaluate_weights(ctx, name, x, y, len(norm["mean"]), float(norm["pos_weight"]))
        logger.info("site=%s model=%s %s", ctx.site, name,
                    " ".join(f"{k}={v:.4f}" for k, v in results[name].items()))
    ctx.exchange.put_json("metrics", "evaluate.json", {"site": ctx.site, "models": results})
    return results
