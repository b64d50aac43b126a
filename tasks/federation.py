"""The coordinator's side of a federated job: global statistics, initial weights, rounds."""

from __future__ import annotations

import time
from typing import Any

import torch
from prefect import get_run_logger, task

from insitu.config import Conf
from insitu.data.features import feature_names
from insitu.federated.exchange import Exchange
from insitu.federated.fedavg import fedavg
from insitu.federated.stats import combine, mean_std
from insitu.models.fraud_mlp import build_model
from tasks.train import round_name


@task(task_run_name="global-statistics")
def publish_global_stats(ex: Exchange, conf: Conf, sites: list[str]) -> dict[str, Any]:
    """Combine the sites' aggregate statistics into global normalisation and class balance."""
    per_site = {s: ex.get_json("stats", "prepare.json", writer=s) for s in sites}
    total = combine(p["train_stats"] for p in per_site.values())
    mean, std = mean_std(total)
    pos = total["positives"]
    norm = {
        "features": feature_names(conf.dataset.schema_),
        "mean": mean,
        "std": std,
        "n": total["n"],
        "positives": pos,
        # Balances the rare fraud class in the loss; the same weight on every site.
        "pos_weight": (total["n"] - pos) / max(pos, 1),
    }
    ex.put_json("stats", "global.json", norm)
    return {"norm": norm, "per_site": per_site}


@task(task_run_name="initial-weights")
def publish_initial_weights(ex: Exchange, conf: Conf, norm: dict[str, Any]) -> dict[str, Any]:
    torch.manual_seed(conf.training.seed)
    model = build_model(conf.training.model, len(norm["mean"]), norm["mean"], norm["std"])
    return ex.put_state("weights", round_name(0), model.state_dict(), round=0)


@task(task_run_name="aggregate-round-{rnd}")
def aggregate_round(
    ex: Exchange, rnd: int, sites: list[str], min_sites: int, deadline_s: float, is_alive: Any = None
) -> dict[str, Any]:
    """Wait for the sites' updates until the deadline, check the quorum, FedAvg, publish the next global.

    A site that misses the deadline is logged and skipped for this round.
    """
    logger = get_run_logger()
    name = round_name(rnd)
    deadline = time.monotonic() + deadline_s
    arrived: list[str] = []
    while True:
        arrived = [s for s in sites if ex.exists("update", f"{name}.manifest.json", writer=s)]
        gone = [s for s in sites if is_alive is not None and not is_alive(s)]
        if len(arrived) == len(sites) or time.monotonic() > deadline or set(arrived) | set(gone) == set(sites):
            break
        time.sleep(0.2)
    missing = [s for s in sites if s not in arrived]
    if missing:
        logger.warning("round %d: no update from %s by the deadline (%.0fs); skipped this round", rnd, missing,
                       deadline_s)
    if len(arrived) < min_sites:
        raise RuntimeError(
            f"round {rnd}: quorum not met: {len(arrived)} site update(s) ({arrived}) < min_sites={min_sites}; "
            f"missing: {missing}"
        )
    updates, manifests = [], {}
    for s in arrived:
        state, man = ex.get_state("update", name, writer=s)
        updates.append((state, int(man["n_samples"])))
        manifests[s] = man
    new = fedavg(updates)
    ex.put_state("weights", round_name(rnd + 1), new, round=rnd + 1, sites=arrived,
                 n_samples=sum(n for _, n in updates))
    logger.info("round %d aggregated from %s (%d samples)", rnd, arrived, sum(n for _, n in updates))
    return {"round": rnd, "sites": arrived, "missing": missing,
            "site_metrics": {s: {**m.get("metrics", {}), "n_samples": m["n_samples"], "bytes": m["bytes"]}
                             for s, m in manifests.items()}}
