"""Coordinator rounds: deadline, quorum and FedAvg over a real (file://) exchange."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from insitu.federated.exchange import Exchange
from insitu.federated.rounds import QuorumError, collect_updates, round_name, run_round
from insitu.storage import Store


def _exchange(tmp_path: Path, writer: str) -> Exchange:
    return Exchange(Store(f"file://{tmp_path}/", {}), "job-1", writer)


def _publish(tmp_path: Path, site: str, rnd: int, value: float, n: int, base: str | None = None) -> None:
    _exchange(tmp_path, site).put_state("update", round_name(rnd), {"w": torch.full((2,), value)}, n_samples=n,
                                        round=rnd, base_sha256=base, metrics={"train_loss": value})


def test_late_site_is_skipped_and_quorum_holds(tmp_path: Path) -> None:
    _publish(tmp_path, "eu", 0, 1.0, 100)
    _publish(tmp_path, "us", 0, 3.0, 300)
    coord = _exchange(tmp_path, "coordinator")
    res = run_round(coord, 0, ["eu", "us", "apac"], min_sites=2, deadline_s=0.5)
    assert res.sites == ["eu", "us"] and res.missing == ["apac"]
    state, man = coord.get_state("weights", round_name(1))
    assert torch.allclose(state["w"], torch.full((2,), 2.5))  # (1*100 + 3*300) / 400
    assert man["n_samples"] == 400 and man["sites"] == ["eu", "us"]
    assert res.site_metrics["us"]["train_loss"] == 3.0


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
    before = coord.get_bytes("weights", f"{round_name(1)}.pt")
    again = run_round(coord, 0, ["eu", "us", "apac"], min_sites=2, deadline_s=30)  # would wait for apac
    assert again.resumed and not first.resumed
    assert again.sites == ["eu", "us"] and again.n_samples == 400 and again.missing == ["apac"]
    assert coord.get_bytes("weights", f"{round_name(1)}.pt") == before
    # the re-run can still log the round's site metrics (if the first attempt stopped before it did)
    assert again.site_metrics == first.site_metrics


def test_update_not_built_on_this_rounds_weights_is_ignored(tmp_path: Path) -> None:
    coord = _exchange(tmp_path, "coordinator")
    base = coord.put_state("weights", round_name(0), {"w": torch.zeros(2)}, round=0)["sha256"]
    _publish(tmp_path, "eu", 0, 1.0, 100, base)
    _publish(tmp_path, "us", 0, 3.0, 300, base)
    _publish(tmp_path, "apac", 0, 9.0, 900, "f" * 64)  # trained from some other model
    res = run_round(coord, 0, ["eu", "us", "apac"], min_sites=2, deadline_s=1)
    assert res.sites == ["eu", "us"] and res.missing == ["apac"] and res.n_samples == 400
    state, man = coord.get_state("weights", round_name(1))
    assert torch.allclose(state["w"], torch.full((2,), 2.5)) and man["sha256"] == res.sha256
    coord.fs.rm(coord.store.path(f"jobs/job-1/weights/coordinator/{round_name(1)}.manifest.json"))
    with pytest.raises(QuorumError, match=r"2 valid update\(s\) .* missing or invalid: \['apac'\]"):
        run_round(coord, 0, ["eu", "us", "apac"], min_sites=3, deadline_s=0.1)
