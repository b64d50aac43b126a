"""The exchange on a local file:// store: manifests, tamper detection, aggregate-only JSON, byte ledger."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from insitu.federated.exchange import KINDS, Exchange, ExchangeError, state_to_bytes
from insitu.storage import Store


def _store(tmp_path: Path) -> Store:
    return Store("file://" + str(tmp_path) + "/", {})


def _state() -> dict[str, torch.Tensor]:
    return {"fc.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3), "fc.bias": torch.tensor([0.5, -1.0])}


def test_fresh_file_store_creates_folders(tmp_path: Path) -> None:
    # a plain local store: fsspec does not create jobs/<job>/<kind>/<writer>/ unless asked to
    ex = Exchange(Store("file://" + str(tmp_path / "fresh") + "/", {}), "job-1", "eu")
    ex.put_json("metrics", "m.json", {"auc": 0.9})
    assert (tmp_path / "fresh/jobs/job-1/metrics/eu/m.json").is_file()
    assert ex.get_json("metrics", "m.json") == {"auc": 0.9}


def test_state_round_trip_and_manifest(tmp_path: Path) -> None:
    ex = Exchange(_store(tmp_path), "job-1", "eu")
    manifest = ex.put_state("update", "round-000", _state(), n_samples=123, round=0)

    pt = tmp_path / "jobs/job-1/update/eu/round-000.pt"
    assert pt.is_file() and (tmp_path / "jobs/job-1/update/eu/round-000.manifest.json").is_file()
    data = pt.read_bytes()
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["bytes"] == len(data)
    assert (manifest["job_id"], manifest["writer"], manifest["name"]) == ("job-1", "eu", "round-000")
    assert (manifest["n_samples"], manifest["round"]) == (123, 0)

    # read back by another party (the coordinator), naming the writer
    coord = Exchange(_store(tmp_path), "job-1", "coordinator")
    state, read_manifest = coord.get_state("update", "round-000", writer="eu")
    assert read_manifest == manifest
    assert list(state) == ["fc.weight", "fc.bias"]
    for k, v in _state().items():
        assert torch.equal(state[k], v)
    assert coord.exists("update", "round-000.pt", writer="eu")
    assert not coord.exists("update", "round-000.pt")  # the coordinator's own folder is empty


def test_tampered_state_is_refused(tmp_path: Path) -> None:
    ex = Exchange(_store(tmp_path), "job-1", "eu")
    ex.put_state("weights", "global-001", _state())
    pt = tmp_path / "jobs/job-1/weights/eu/global-001.pt"
    data = bytearray(pt.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pt.write_bytes(bytes(data))
    with pytest.raises(ExchangeError, match="does not match its manifest"):
        ex.get_state("weights", "global-001")


def test_state_swapped_for_another_valid_state_is_refused(tmp_path: Path) -> None:
    ex = Exchange(_store(tmp_path), "job-1", "eu")
    ex.put_state("update", "u", _state())
    other = {k: v + 1 for k, v in _state().items()}
    ex.put_bytes("update", "u.pt", state_to_bytes(other))
    with pytest.raises(ExchangeError, match="corrupt or tampered"):
        ex.get_state("update", "u")


def test_missing_artefacts_raise_exchange_error(tmp_path: Path) -> None:
    ex = Exchange(_store(tmp_path), "job-1", "eu")
    with pytest.raises(ExchangeError, match="missing on the exchange"):
        ex.get_state("update", "nope")
    with pytest.raises(ExchangeError, match="missing on the exchange"):
        ex.get_json("metrics", "nope.json")


def test_put_state_only_under_model_kinds(tmp_path: Path) -> None:
    ex = Exchange(_store(tmp_path), "job-1", "eu")
    with pytest.raises(ExchangeError, match="'weights' or 'update'"):
        ex.put_state("metrics", "x", _state())
    assert not (tmp_path / "jobs").exists()


def test_put_json_round_trip(tmp_path: Path) -> None:
    ex = Exchange(_store(tmp_path), "job-1", "us")
    obj = {"auc": 0.91, "counts": [1, 2, 3], "nested": {"n": 4}}
    key = ex.put_json("metrics", "round-1.json", obj)
    assert key == "jobs/job-1/metrics/us/round-1.json"
    assert ex.get_json("metrics", "round-1.json") == obj
    assert json.loads((tmp_path / key).read_bytes()) == obj


def test_put_json_refuses_dataframe_nested_in_dict(tmp_path: Path) -> None:
    ex = Exchange(_store(tmp_path), "job-1", "eu")
    df = pd.DataFrame({"transaction_id": ["eu-1", "eu-2"], "amount": [1.0, 2.0]})
    with pytest.raises(ExchangeError, match=r"\$\.outer\.rows: a table may not be written"):
        ex.put_json("stats", "s.json", {"outer": {"rows": df}, "n": 2})
    with pytest.raises(ExchangeError, match="a table may not be written"):
        ex.put_json("stats", "s.json", {"parts": [{"ok": 1}, df]})
    assert not (tmp_path / "jobs/job-1/stats/eu/s.json").exists()


def test_put_json_refuses_many_records(tmp_path: Path) -> None:
    ex = Exchange(_store(tmp_path), "job-1", "eu")
    rows = [{"transaction_id": f"eu-{i}"} for i in range(1001)]
    with pytest.raises(ExchangeError, match="1001 records look like rows"):
        ex.put_json("summary", "s.json", {"rows": rows})
    ex.put_json("summary", "ok.json", {"rows": rows[:1000]})  # at the limit: still allowed


@pytest.mark.parametrize("kind", ["raw", "data", "prepared", "rows", ""])
def test_unknown_kinds_are_refused(tmp_path: Path, kind: str) -> None:
    ex = Exchange(_store(tmp_path), "job-1", "eu")
    with pytest.raises(ExchangeError, match="may not be written to the exchange"):
        ex.put_json(kind, "x.json", {"a": 1})
    with pytest.raises(ExchangeError, match="may not be written to the exchange"):
        ex.put_bytes(kind, "x.bin", b"123")
    assert kind not in KINDS
    assert not (tmp_path / "jobs").exists()


def _sizes_on_disk(root: Path, job: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for dirpath, _, files in os.walk(root / "jobs" / job):
        for f in files:
            full = os.path.join(dirpath, f)
            kind, writer = Path(full).relative_to(root / "jobs" / job).parts[:2]
            out.setdefault(writer, {}).setdefault(kind, 0)
            out[writer][kind] += os.path.getsize(full)
    return out


def test_ledger_counts_exact_bytes_per_writer_and_kind(tmp_path: Path) -> None:
    store = _store(tmp_path)
    coord = Exchange(store, "j1", "coordinator")
    eu = Exchange(store, "j1", "eu")
    us = Exchange(store, "j1", "us")
    other_job = Exchange(store, "j10", "eu")  # a prefix of j1's name must not leak into j1's ledger

    coord.put_json("plan", "plan.json", {"rounds": 2, "sites": ["eu", "us"]})
    coord.put_state("weights", "global-000", _state())
    coord.put_bytes("control", "stop", b"")
    eu.put_json("stats", "train.json", {"n": 10, "sum": [1.0, 2.0]})
    eu.put_state("update", "round-000", _state(), n_samples=10)
    eu.put_state("update", "round-001", _state(), n_samples=10)
    us.put_json("metrics", "round-000.json", {"auc": 0.5})
    us.put_bytes("update", "blob.pt", b"x" * 4321)
    other_job.put_bytes("update", "big.pt", b"y" * 100_000)
    other_job.put_json("metrics", "m.json", {"auc": 0.1})

    expected = _sizes_on_disk(tmp_path, "j1")
    assert set(expected) == {"coordinator", "eu", "us"}
    assert expected["us"]["update"] == 4321
    assert expected["coordinator"]["control"] == 0
    # the update kind of eu holds two .pt files and two manifests
    eu_update = tmp_path / "jobs/j1/update/eu"
    assert expected["eu"]["update"] == sum(os.path.getsize(p) for p in eu_update.iterdir())

    ledger = eu.ledger()
    assert ledger == expected
    assert coord.ledger() == expected  # whoever asks, the job's ledger is the same
    assert (
        other_job.ledger()
        == _sizes_on_disk(tmp_path, "j10")
        == {"eu": {"update": 100_000, "metrics": len(b'{"auc": 0.1}')}}
    )
    assert Exchange(store, "never-ran", "eu").ledger() == {}


def test_list_is_sorted_and_scoped(tmp_path: Path) -> None:
    store = _store(tmp_path)
    a, b = Exchange(store, "j1", "eu"), Exchange(store, "j1", "us")
    b.put_bytes("update", "2.bin", b"2")
    a.put_bytes("update", "1.bin", b"1")
    a.put_bytes("metrics", "m.json", b"{}")
    listed = a.list("update")
    assert [p.rsplit("/", 2)[-2:] for p in listed] == [["eu", "1.bin"], ["us", "2.bin"]]
    assert [p.rsplit("/", 1)[-1] for p in a.list("update", writer="us")] == ["2.bin"]
    assert a.list("plan") == []


def test_wait_for_times_out_quickly(tmp_path: Path) -> None:
    ex = Exchange(_store(tmp_path), "job-1", "coordinator")
    t0 = time.monotonic()
    assert ex.wait_for("update", "round-000.manifest.json", writer="eu", timeout=0.3, poll=0.05) is False
    elapsed = time.monotonic() - t0
    assert 0.3 <= elapsed < 2.0


def test_wait_for_sees_existing_artefact(tmp_path: Path) -> None:
    store = _store(tmp_path)
    Exchange(store, "job-1", "eu").put_state("update", "round-000", _state())
    ex = Exchange(store, "job-1", "coordinator")
    t0 = time.monotonic()
    assert ex.wait_for("update", "round-000.manifest.json", writer="eu", timeout=5.0)
    assert time.monotonic() - t0 < 1.0
