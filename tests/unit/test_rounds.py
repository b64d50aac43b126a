"""Coordinator rounds: deadline, quorum, FedAvg, and the re-check of every update, over a real (file://) exchange."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import torch
from protocol_examples import prepare_stats, ran_as, store

from insitu.federated.aggregators import FedAvg
from insitu.federated.claims import STALE_RULE
from insitu.federated.exchange import Exchange, state_to_bytes
from insitu.federated.kinds import ProtocolViolation
from insitu.federated.rounds import QuorumError, collect_updates, round_name, run_round, stale_updates

GLOBAL = {"w": torch.zeros(2)}


def _exchange(tmp_path: Path, writer: str) -> Exchange:
    return Exchange(store(tmp_path), "job-1", writer)


def _global(tmp_path: Path, rnd: int = 0) -> str:
    """The coordinator's global weights of round ``rnd`` (zeros); returns their SHA-256."""
    coord = _exchange(tmp_path, "coordinator")
    if not coord.exists("weights", f"{round_name(rnd)}.manifest.json"):
        coord.put_state("weights", round_name(rnd), GLOBAL, round=rnd)
    return coord.get_json("weights", f"{round_name(rnd)}.manifest.json")["sha256"]


def _publish(tmp_path: Path, site: str, rnd: int, value: float, n: int, base: str | None = None) -> None:
    base = base or _global(tmp_path, rnd)
    _exchange(tmp_path, site).put_state("update", round_name(rnd), {"w": torch.full((2,), value)}, reference=GLOBAL,
                                        n_samples=n, round=rnd, base_sha256=base, metrics={"train_loss": value})


def _forge(tmp_path: Path, site: str, state: dict[str, torch.Tensor], rnd: int = 0) -> None:
    """An update written around the Exchange (as a site could with s3fs): a consistent manifest, any state."""
    data = state_to_bytes(state)
    ex = _exchange(tmp_path, site)
    ex._put_bytes("update", f"{round_name(rnd)}.pt", data)
    manifest = {"job_id": "job-1", "writer": site, "name": round_name(rnd), "round": rnd, "n_samples": 500,
                "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "created": "2025-01-01T00:00:00+00:00",
                "base_sha256": _global(tmp_path, rnd), "ran_as": ran_as(site)}
    ex._put_bytes("update", f"{round_name(rnd)}.manifest.json", json.dumps(manifest).encode())


def test_late_site_is_skipped_and_quorum_holds(tmp_path: Path) -> None:
    _publish(tmp_path, "eu", 0, 1.0, 100)
    _publish(tmp_path, "us", 0, 3.0, 300)
    coord = _exchange(tmp_path, "coordinator")
    res = run_round(coord, 0, ["eu", "us", "apac"], min_sites=2, deadline_s=0.5)
    assert res.sites == ["eu", "us"] and res.missing == ["apac"] and res.rejected == {}
    state, man = coord.get_state("weights", round_name(1))
    assert torch.allclose(state["w"], torch.full((2,), 2.5))  # (1*100 + 3*300) / 400
    assert man["n_samples"] == 400 and man["sites"] == ["eu", "us"]
    assert res.site_metrics["us"]["train_loss"] == 3.0
    assert res.as_dict()["rejected"] == {}


def test_an_update_that_arrives_after_its_round_closed_is_stale_and_not_merged(tmp_path: Path) -> None:
    _publish(tmp_path, "eu", 0, 1.0, 100)
    _publish(tmp_path, "us", 0, 3.0, 300)
    coord = _exchange(tmp_path, "coordinator")
    res = run_round(coord, 0, ["eu", "us", "apac"], min_sites=2, deadline_s=0.3)
    assert stale_updates(coord, {0: res.missing}, 0.3) == []  # apac has not published: nothing to refuse yet
    made = coord.get_state("weights", round_name(1))[0]["w"].clone()
    _publish(tmp_path, "apac", 0, 50.0, 10_000)  # apac is back, and publishes the closed round's update
    ((rnd, refusal),) = stale_updates(coord, {0: res.missing}, 0.3)
    assert rnd == 0 and refusal.site == "apac" and refusal.rule == STALE_RULE
    assert "arrived after the round closed" in refusal.reason and "0.3 s" in refusal.reason
    assert torch.equal(coord.get_state("weights", round_name(1))[0]["w"], made)  # round 1's model is unchanged


def test_below_quorum_fails_naming_the_missing_sites(tmp_path: Path) -> None:
    _publish(tmp_path, "eu", 0, 1.0, 100)
    with pytest.raises(QuorumError, match=r"1 update\(s\) from \['eu'\] < min_sites=2; missing: \['us', 'apac'\]"):
        run_round(_exchange(tmp_path, "coordinator"), 0, ["eu", "us", "apac"], min_sites=2, deadline_s=0.3)
    assert not _exchange(tmp_path, "coordinator").exists("weights", f"{round_name(1)}.manifest.json")


def test_does_not_wait_for_sites_whose_run_ended(tmp_path: Path) -> None:
    import time

    _publish(tmp_path, "eu", 0, 1.0, 100)
    t0 = time.monotonic()
    arrived, missing = collect_updates(_exchange(tmp_path, "coordinator"), 0, ["eu", "us"], deadline_s=30,
                                       is_alive=lambda s: False)
    assert (arrived, missing) == (["eu"], ["us"])
    assert time.monotonic() - t0 < 5


def test_rerun_of_a_job_reuses_an_aggregated_round(tmp_path: Path) -> None:
    _publish(tmp_path, "eu", 0, 1.0, 100)
    _publish(tmp_path, "us", 0, 3.0, 300)
    coord = _exchange(tmp_path, "coordinator")
    first = run_round(coord, 0, ["eu", "us"], min_sites=2, deadline_s=1)
    before = (tmp_path / f"jobs/job-1/weights/coordinator/{round_name(1)}.pt").read_bytes()
    again = run_round(coord, 0, ["eu", "us", "apac"], min_sites=2, deadline_s=30)  # would wait for apac
    assert again.resumed and not first.resumed
    assert again.sites == ["eu", "us"] and again.n_samples == 400 and again.missing == ["apac"]
    assert (tmp_path / f"jobs/job-1/weights/coordinator/{round_name(1)}.pt").read_bytes() == before
    # the re-run can still log the round's site metrics (if the first attempt stopped before it did)
    assert again.site_metrics == first.site_metrics


def test_update_not_built_on_this_rounds_weights_is_rejected(tmp_path: Path) -> None:
    base = _global(tmp_path)
    _publish(tmp_path, "eu", 0, 1.0, 100, base)
    _publish(tmp_path, "us", 0, 3.0, 300, base)
    _publish(tmp_path, "apac", 0, 9.0, 900, "f" * 64)  # trained from some other model
    coord = _exchange(tmp_path, "coordinator")
    res = run_round(coord, 0, ["eu", "us", "apac"], min_sites=2, deadline_s=1)
    assert res.sites == ["eu", "us"] and res.missing == ["apac"] and res.n_samples == 400
    assert "not trained from round 0's global weights" in res.rejected["apac"]
    state, man = coord.get_state("weights", round_name(1))
    assert torch.allclose(state["w"], torch.full((2,), 2.5)) and man["sha256"] == res.sha256
    coord.fs.rm(coord.store.path(f"jobs/job-1/weights/coordinator/{round_name(1)}.manifest.json"))
    with pytest.raises(QuorumError, match=r"2 valid update\(s\) .* missing or invalid: \['apac'\]; rejected: "):
        run_round(coord, 0, ["eu", "us", "apac"], min_sites=3, deadline_s=0.1)


@pytest.mark.parametrize(("state", "reason"), [
    ({"w": torch.zeros(2), "rows": torch.tensor([[4111.0, 12.5], [4242.0, 99.0]])}, r"extra \['rows'\]"),
    ({"w": torch.zeros(20)}, r"'w' has shape \(20,\); the global model's is \(2,\)"),
    ({"w": torch.tensor([float("nan"), 0.0])}, "'w' holds NaN or infinite values"),
    ({"w": torch.tensor([1e6, 0.0])}, r"\|\|update - global\|\|_2 = 1e\+06 exceeds the bound 100"),
    ({"w": torch.zeros(2, dtype=torch.float64)}, "'w' has dtype torch.float64; the global model's is torch.float32"),
])
def test_an_invalid_update_is_rejected_with_its_reason_and_the_round_goes_on(
        tmp_path: Path, state: dict[str, torch.Tensor], reason: str) -> None:
    _publish(tmp_path, "eu", 0, 1.0, 100)
    _publish(tmp_path, "us", 0, 3.0, 300)
    _forge(tmp_path, "apac", state)
    res = run_round(_exchange(tmp_path, "coordinator"), 0, ["eu", "us", "apac"], min_sites=2, deadline_s=1)
    assert res.sites == ["eu", "us"] and res.missing == ["apac"] and res.n_samples == 400
    assert list(res.rejected) == ["apac"]
    assert "update/round-0000.pt of apac" in res.rejected["apac"]
    assert re.search(reason, res.rejected["apac"]), res.rejected["apac"]
    assert res.as_dict()["rejected"] == res.rejected


def test_an_update_with_a_manifest_outside_the_schema_is_rejected(tmp_path: Path) -> None:
    _publish(tmp_path, "eu", 0, 1.0, 100)
    _forge(tmp_path, "us", {"w": torch.ones(2)})
    path = tmp_path / "jobs/job-1/update/us/round-0000.manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "rows": [{"amount": 1.0}]}))
    res = run_round(_exchange(tmp_path, "coordinator"), 0, ["eu", "us"], min_sites=1, deadline_s=1)
    assert res.sites == ["eu"] and "rows: key not allowed by the protocol" in res.rejected["us"]


def test_rejections_that_break_the_quorum_fail_the_round_with_the_reasons(tmp_path: Path) -> None:
    _publish(tmp_path, "eu", 0, 1.0, 100)
    _forge(tmp_path, "us", {"w": torch.zeros(3)})
    with pytest.raises(QuorumError, match=r"1 valid update\(s\) from \['eu'\] .*rejected: \{'us': .*shape \(3,\)"):
        run_round(_exchange(tmp_path, "coordinator"), 0, ["eu", "us"], min_sites=2, deadline_s=1)


def test_a_site_over_its_byte_budget_stops_the_job_before_its_update_is_read(tmp_path: Path) -> None:
    _publish(tmp_path, "eu", 0, 1.0, 100)
    _publish(tmp_path, "us", 0, 3.0, 300)
    us = _exchange(tmp_path, "us")
    doc = prepare_stats("us")
    doc["shards"] = {f"us-{i:03d}": {**doc["shards"]["us-000"], "error": "e" * 400} for i in range(200)}
    us._put_bytes("stats", "prepare.json", json.dumps(doc).encode())  # > 64 KiB of statistics
    with pytest.raises(ProtocolViolation, match=r"round 0: .*'us' has [\d,]+ bytes of 'stats' on the exchange; its "
                                                r"budget is 65,536"):
        run_round(_exchange(tmp_path, "coordinator"), 0, ["eu", "us"], min_sites=1, deadline_s=1)
    assert not _exchange(tmp_path, "coordinator").exists("weights", f"{round_name(1)}.manifest.json")


def test_an_update_far_larger_than_the_global_model_stops_the_job(tmp_path: Path) -> None:
    _publish(tmp_path, "eu", 0, 1.0, 100)
    _forge(tmp_path, "us", {"w": torch.zeros(2), "rows": torch.zeros(50_000)})
    with pytest.raises(ProtocolViolation, match="'us' has [\\d,]+ bytes of 'update' on the exchange; its budget is"):
        run_round(_exchange(tmp_path, "coordinator"), 0, ["eu", "us"], min_sites=1, deadline_s=1)


def test_an_object_outside_the_protocol_stops_the_job(tmp_path: Path) -> None:
    _publish(tmp_path, "eu", 0, 1.0, 100)
    _exchange(tmp_path, "eu")._put_bytes("update", "rows.csv", b"a,b\n1,2\n")
    with pytest.raises(ProtocolViolation, match="update/eu/rows.csv is not an artefact of the protocol"):
        run_round(_exchange(tmp_path, "coordinator"), 0, ["eu"], min_sites=1, deadline_s=1)


class _Recording(FedAvg):
    """FedAvg that remembers how many updates it was handed at once."""

    name = "recording-fedavg-test"
    seen: list[int] = []

    def _aggregate(self, rnd, global_state, updates, server_state):  # type: ignore[no-untyped-def]
        self.seen.append(len(updates))
        return super()._aggregate(rnd, global_state, updates, server_state)


@pytest.mark.parametrize(("mean_based", "handed"), [(True, 1), (False, 3)])
def test_a_mean_based_aggregator_gets_one_running_mean_not_every_update(tmp_path: Path, mean_based: bool,
                                                                        handed: int) -> None:
    for i, site in enumerate(["eu", "us", "apac"]):
        _publish(tmp_path, site, 0, float(i + 1), 100 * (i + 1))
    agg = _Recording()
    agg.mean_based, agg.seen = mean_based, []
    res = run_round(_exchange(tmp_path, "coordinator"), 0, ["eu", "us", "apac"], min_sites=3, deadline_s=1,
                    aggregator=agg)
    assert agg.seen == [handed] and res.n_samples == 600
    new, _ = _exchange(tmp_path, "eu").get_state("weights", "round-0001", "coordinator")
    assert torch.allclose(new["w"], torch.full((2,), (1 * 100 + 2 * 200 + 3 * 300) / 600))
