"""Valid exchange documents and model states, as the flows write them, for the unit tests of the protocol."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from insitu.federated.exchange import Exchange
from insitu.federated.rounds import round_name
from insitu.storage import Store


def store(tmp_path: Path) -> Store:
    return Store(f"file://{tmp_path}/", {})


def ran_as(actor: str) -> dict[str, str]:
    return {"actor": actor, "os_user": f"insitu-{actor}", "pool": f"insitu-{actor}"}


def train_stats(n: int = 100, width: int = 2) -> dict[str, Any]:
    return {"n": n, "sum": [1.0] * width, "sumsq": [2.0] * width, "label_counts": [n - 3, 3]}


def prepare_stats(site: str, n: int = 100, width: int = 2) -> dict[str, Any]:
    """What ``site-prepare`` publishes: :func:`insitu.data.prepare.summarize` plus raw bytes, site, identity."""
    shard = {"rows_read": n + 5, "rows_prepared": n, "rows_quarantined": 5, "error": None, "quarantine_path": None,
             "split_counts": {"train": n, "val": 0, "test": 0}}
    return {"shards": {f"{site}-000": shard}, "rows_read": n + 5, "rows_prepared": n, "rows_quarantined": 5,
            "shards_unreadable": [], "split_counts": {"train": n, "val": 0, "test": 0},
            "train_stats": train_stats(n, width), "raw_bytes": 1234, "site": site, "ran_as": ran_as(site)}


def model_metrics(count: float = 100.0) -> dict[str, float]:
    return {"roc_auc": 0.8, "pr_auc": 0.3, "loss": 0.4, "count": count, "positive_rate": 0.1}


def evaluation(site: str, models: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"site": site, "ran_as": ran_as(site), "models": models or {"round-0002": model_metrics()}}


def global_state(width: int = 3) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {"fc.weight": torch.randn(2, width), "fc.bias": torch.zeros(2)}


def shifted(state: dict[str, torch.Tensor], by: float) -> dict[str, torch.Tensor]:
    return {k: v + by for k, v in state.items()}


def publish_global(tmp_path: Path, rnd: int = 0, state: dict[str, torch.Tensor] | None = None,
                   job: str = "job-1") -> tuple[dict[str, torch.Tensor], str]:
    """The coordinator's global weights of round ``rnd``; returns them and their SHA-256."""
    state = state if state is not None else global_state()
    man = Exchange(store(tmp_path), job, "coordinator").put_state("weights", round_name(rnd), state, round=rnd)
    return state, man["sha256"]


def publish_update(tmp_path: Path, site: str, rnd: int, state: dict[str, torch.Tensor],
                   reference: dict[str, torch.Tensor], base: str, n: int = 100, job: str = "job-1",
                   metrics: dict[str, float] | None = None) -> dict[str, Any]:
    return Exchange(store(tmp_path), job, site).put_state(
        "update", round_name(rnd), state, reference=reference, round=rnd, n_samples=n, base_sha256=base,
        metrics=metrics or {"train_loss": 0.5}, ran_as=ran_as(site))
