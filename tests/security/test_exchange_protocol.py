"""The exchange accepts only what the protocol allows: attacks by a site's writer on the running platform's S3.

Each party uses its own IAM keys on the platform's exchange endpoint. A site may write anything under its own
prefix (IAM cannot tell a row from an aggregate), so the protocol is enforced twice: by the site's own
:class:`Exchange` before writing, and by the coordinator, which re-checks everything it reads and stops the job
when a site writes outside the protocol. Here the site goes around its own checks with s3fs.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

import pandas as pd
import pytest
import s3fs
import torch

from deployments.platform import COORDINATOR, Platform
from insitu.federated.exchange import Exchange, ExchangeError, enforce_protocol, state_to_bytes
from insitu.federated.kinds import ProtocolViolation, site_budgets
from insitu.federated.rounds import round_name, run_round
from insitu.storage import Store

pytestmark = pytest.mark.e2e

GLOBAL = {"fc.weight": torch.full((2, 3), 0.1), "fc.bias": torch.zeros(2)}


def _job() -> str:
    return f"e2e-protocol-{uuid.uuid4().hex[:8]}"


def _exchange(platform: Platform, writer: str, job: str) -> Exchange:
    return Exchange(Store(platform.sites.exchange.storage, platform.storage_options("exchange", writer)), job, writer)


def _raw(platform: Platform, writer: str) -> s3fs.S3FileSystem:
    """The writer's own keys, straight to S3: what a site admin can do around insitu's code."""
    return s3fs.S3FileSystem(**platform.storage_options("exchange", writer))


def _bucket(platform: Platform) -> str:
    return platform.sites.exchange.storage.removeprefix("s3://").rstrip("/")


def _ran_as(site: str) -> dict[str, str]:
    return {"actor": site, "os_user": f"insitu-{site}", "pool": f"insitu-{site}"}


def _prepare_stats(site: str) -> dict[str, Any]:
    counts = {"train": 100, "val": 0, "test": 0}
    shard = {"rows_read": 100, "rows_prepared": 100, "rows_quarantined": 0, "split_counts": counts}
    return {"site": site, "ran_as": _ran_as(site), "shards": {f"{site}-000": shard}, "rows_read": 100,
            "rows_prepared": 100, "rows_quarantined": 0, "shards_unreadable": [], "split_counts": counts,
            "train_stats": {"n": 100, "sum": [1.0, 2.0], "sumsq": [3.0, 4.0], "label_counts": [95, 5]}, "raw_bytes": 10}


def test_a_site_cannot_publish_rows_through_the_exchange(platform: Platform) -> None:
    job = _job()
    eu = _exchange(platform, "eu", job)
    rows = [{"transaction_id": "eu-1", "amount": 12.5}, {"transaction_id": "eu-2", "amount": 99.0}]
    attempts = [
        {**_prepare_stats("eu"), "rows": rows},  # a short list of records
        {**_prepare_stats("eu"), "train_stats": {**_prepare_stats("eu")["train_stats"], "amount": [12.5, 99.0]}},
        {**_prepare_stats("eu"), "rows": pd.DataFrame(rows)},  # a table
        {**_prepare_stats("eu"), "shards_unreadable": ["eu-1,12.50,DE;eu-2,99.00,FR"]},  # a string of data
    ]
    for doc in attempts:
        with pytest.raises(ExchangeError, match="stats/prepare.json of eu"):
            eu.put_json("stats", "prepare.json", doc)
    with pytest.raises(ExchangeError, match="not an artefact of the exchange protocol"):
        eu.put_json("stats", "rows.json", rows)
    assert _raw(platform, COORDINATOR).find(f"{_bucket(platform)}/jobs/{job}/") == []  # nothing was written


def test_bytes_written_around_the_exchange_are_refused_by_the_coordinator(platform: Platform) -> None:
    job = _job()
    raw, bucket = _raw(platform, "eu"), _bucket(platform)
    csv = b"transaction_id,amount,country\neu-1,12.50,DE\neu-2,99.00,FR\n"
    raw.pipe(f"{bucket}/jobs/{job}/stats/eu/rows.csv", csv)  # IAM allows it: eu's own prefix
    raw.pipe(f"{bucket}/jobs/{job}/stats/eu/prepare.json", csv)  # rows under a protocol name
    coord = _exchange(platform, COORDINATOR, job)
    with pytest.raises(ExchangeError, match="stats/rows.csv of eu: not an artefact of the exchange protocol"):
        coord.get_json("stats", "rows.csv", writer="eu")
    with pytest.raises(ExchangeError, match="stats/prepare.json of eu .*Invalid JSON"):
        coord.get_json("stats", "prepare.json", writer="eu")
    with pytest.raises(ProtocolViolation, match="stats/eu/rows.csv is not an artefact of the protocol"):
        enforce_protocol(coord, site_budgets(1, 10_000), "evaluate")
    # and a site over its budget of statistics stops the job, whatever the names
    raw.pipe(f"{bucket}/jobs/{job}/stats/eu/prepare.json", b" " * (65 * 1024))
    with pytest.raises(ProtocolViolation, match="'eu' has [\\d,]+ bytes of 'stats' on the exchange; its budget"):
        enforce_protocol(coord, site_budgets(1, 10_000), "evaluate")


def _forge_update(platform: Platform, site: str, job: str, state: dict[str, torch.Tensor], base: str) -> None:
    """An update written with s3fs: a state file and a manifest that matches it (its SHA-256, its size)."""
    data = state_to_bytes(state)
    manifest = {"job_id": job, "writer": site, "name": round_name(0), "round": 0, "n_samples": 500,
                "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
                "created": "2025-01-01T00:00:00+00:00", "base_sha256": base, "ran_as": _ran_as(site)}
    raw, prefix = _raw(platform, site), f"{_bucket(platform)}/jobs/{job}/update/{site}/{round_name(0)}"
    raw.pipe(f"{prefix}.pt", data)
    raw.pipe(f"{prefix}.manifest.json", json.dumps(manifest).encode())


@pytest.mark.parametrize(("state", "reason"), [
    ({**GLOBAL, "rows": torch.tensor([[4111.0, 12.5], [4242.0, 99.0]])}, "extra ['rows']"),
    ({**GLOBAL, "fc.bias": torch.tensor([12.5, 99.0, 7.0])}, "'fc.bias' has shape (3,); the global model's is (2,)"),
    ({**GLOBAL, "fc.bias": torch.tensor([float("nan"), 0.0])}, "'fc.bias' holds NaN or infinite values"),
])
def test_an_invalid_update_is_refused_by_the_site_and_rejected_by_the_coordinator(
        platform: Platform, state: dict[str, torch.Tensor], reason: str) -> None:
    job = _job()
    coord = _exchange(platform, COORDINATOR, job)
    base = coord.put_state("weights", round_name(0), GLOBAL, round=0)["sha256"]
    eu, us = _exchange(platform, "eu", job), _exchange(platform, "us", job)
    with pytest.raises(ExchangeError, match="update/round-0000.pt of eu"):  # the site's own check, before writing
        eu.put_state("update", round_name(0), state, reference=GLOBAL, round=0, n_samples=500, base_sha256=base)
    assert not coord.exists("update", f"{round_name(0)}.pt", writer="eu")
    us.put_state("update", round_name(0), {k: v + 0.01 for k, v in GLOBAL.items()}, reference=GLOBAL, round=0,
                 n_samples=300, base_sha256=base, metrics={"train_loss": 0.4}, ran_as=_ran_as("us"))
    _forge_update(platform, "eu", job, state, base)  # around the site's own check

    res = run_round(_exchange(platform, COORDINATOR, job), 0, ["eu", "us"], min_sites=1, deadline_s=30)
    assert res.sites == ["us"] and res.missing == ["eu"] and res.n_samples == 300
    assert reason in res.rejected["eu"] and "update/round-0000.pt of eu" in res.rejected["eu"]
    weights, man = coord.get_state("weights", round_name(1))
    assert man["sites"] == ["us"] and torch.allclose(weights["fc.bias"], torch.full((2,), 0.01))


def test_the_coordinator_sees_an_update_written_after_it_listed_the_job(platform: Platform) -> None:
    """s3fs answers exists() from a cached listing: the budget check's listing must not hide later updates."""
    job = _job()
    coord = _exchange(platform, COORDINATOR, job)
    base = coord.put_state("weights", round_name(0), GLOBAL, round=0)["sha256"]
    enforce_protocol(coord, site_budgets(1, 10_000), "round 0")  # lists the job's prefix
    assert not coord.exists("update", f"{round_name(0)}.manifest.json", writer="us")
    _exchange(platform, "us", job).put_state(
        "update", round_name(0), {k: v + 0.01 for k, v in GLOBAL.items()}, reference=GLOBAL, round=0,
        n_samples=300, base_sha256=base, metrics={"train_loss": 0.4}, ran_as=_ran_as("us"))
    assert coord.exists("update", f"{round_name(0)}.manifest.json", writer="us")
