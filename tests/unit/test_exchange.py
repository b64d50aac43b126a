"""The exchange on a local file:// store: the protocol's documents only, manifests, tamper detection, ledger."""

from __future__ import annotations

import hashlib
import json
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
import torch
from protocol_examples import (
    evaluation,
    global_state,
    model_metrics,
    prepare_stats,
    publish_global,
    publish_update,
    shifted,
    store,
)

from insitu.federated.exchange import KINDS, Exchange, ExchangeError, state_to_bytes
from insitu.federated.paths import EVALUATION


def test_fresh_file_store_creates_folders(tmp_path: Path) -> None:
    # a plain local store: fsspec does not create jobs/<job>/<kind>/<writer>/ unless asked to
    ex = Exchange(store(tmp_path / "fresh"), "job-1", "eu")
    ex.put_json("metrics", "evaluate.json", evaluation("eu"))
    assert (tmp_path / "fresh/jobs/job-1/metrics/eu/evaluate.json").is_file()
    assert ex.get_json("metrics", "evaluate.json") == evaluation("eu")


def test_modified_says_when_a_document_was_written_and_none_before(tmp_path: Path) -> None:
    ex = Exchange(store(tmp_path), "job-1", "eu")
    assert ex.modified(EVALUATION) is None
    before = datetime.now(UTC) - timedelta(seconds=1)
    ex.put_json(EVALUATION, evaluation("eu"))
    written = ex.modified(EVALUATION)
    assert written is not None and before <= written <= datetime.now(UTC) + timedelta(seconds=1)
    assert Exchange(store(tmp_path), "job-1", "coordinator").modified(EVALUATION, writer="eu") == written


def test_state_round_trip_and_manifest(tmp_path: Path) -> None:
    ref, base = publish_global(tmp_path)
    manifest = publish_update(tmp_path, "eu", 0, shifted(ref, 0.1), ref, base, n=123)

    pt = tmp_path / "jobs/job-1/update/eu/round-0000.pt"
    assert pt.is_file() and (tmp_path / "jobs/job-1/update/eu/round-0000.manifest.json").is_file()
    data = pt.read_bytes()
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["bytes"] == len(data)
    assert (manifest["job_id"], manifest["writer"], manifest["name"]) == ("job-1", "eu", "round-0000")
    assert (manifest["n_samples"], manifest["round"], manifest["base_sha256"]) == (123, 0, base)

    # read back by another party (the coordinator), naming the writer
    coord = Exchange(store(tmp_path), "job-1", "coordinator")
    state, read_manifest = coord.get_state("update", "round-0000", writer="eu", reference=ref)
    assert read_manifest == manifest
    assert list(state) == ["fc.weight", "fc.bias"]
    for k, v in shifted(ref, 0.1).items():
        assert torch.equal(state[k], v)
    assert coord.exists("update", "round-0000.pt", writer="eu")
    assert not coord.exists("update", "round-0000.pt")  # the coordinator's own folder is empty


def test_tampered_state_is_refused(tmp_path: Path) -> None:
    publish_global(tmp_path, 1)
    pt = tmp_path / "jobs/job-1/weights/coordinator/round-0001.pt"
    data = bytearray(pt.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pt.write_bytes(bytes(data))
    with pytest.raises(ExchangeError, match="does not match its manifest"):
        Exchange(store(tmp_path), "job-1", "eu").get_state("weights", "round-0001", writer="coordinator")


def test_state_swapped_for_another_valid_state_is_refused(tmp_path: Path) -> None:
    ref, base = publish_global(tmp_path)
    publish_update(tmp_path, "eu", 0, ref, ref, base)
    Exchange(store(tmp_path), "job-1", "eu")._put_bytes("update", "round-0000.pt", state_to_bytes(shifted(ref, 1)))
    with pytest.raises(ExchangeError, match="corrupt or tampered"):
        Exchange(store(tmp_path), "job-1", "coordinator").get_state("update", "round-0000", writer="eu")


def test_missing_artefacts_raise_exchange_error(tmp_path: Path) -> None:
    ex = Exchange(store(tmp_path), "job-1", "eu")
    with pytest.raises(ExchangeError, match="missing on the exchange"):
        ex.get_state("update", "round-0000")
    with pytest.raises(ExchangeError, match="missing on the exchange"):
        ex.get_json("metrics", "evaluate.json")


def test_put_state_only_under_model_kinds_and_protocol_names(tmp_path: Path) -> None:
    ex = Exchange(store(tmp_path), "job-1", "eu")
    ref = global_state()
    with pytest.raises(ExchangeError, match="'weights' or 'update'"):
        ex.put_state("metrics", "x", ref)
    with pytest.raises(ExchangeError, match="update/rows.pt of eu: not an artefact of the exchange protocol"):
        ex.put_state("update", "rows", ref, reference=ref)
    with pytest.raises(ExchangeError, match="only the coordinator writes weights"):
        ex.put_state("weights", "round-0001", ref, round=1)
    assert not (tmp_path / "jobs").exists()


def test_no_public_raw_byte_writer() -> None:
    assert not hasattr(Exchange, "put_bytes") and not hasattr(Exchange, "get_bytes")


def test_put_json_round_trip(tmp_path: Path) -> None:
    ex = Exchange(store(tmp_path), "job-1", "us")
    obj = prepare_stats("us")
    key = ex.put_json("stats", "prepare.json", obj)
    assert key == "jobs/job-1/stats/us/prepare.json"
    assert ex.get_json("stats", "prepare.json") == obj
    assert json.loads((tmp_path / key).read_bytes()) == obj


def test_put_json_refuses_a_table_or_bytes_anywhere(tmp_path: Path) -> None:
    ex = Exchange(store(tmp_path), "job-1", "eu")
    df = pd.DataFrame({"transaction_id": ["eu-1", "eu-2"], "amount": [1.0, 2.0]})
    with pytest.raises(ExchangeError, match=r"stats/prepare.json of eu .*not a JSON document.*DataFrame"):
        ex.put_json("stats", "prepare.json", {**prepare_stats("eu"), "rows": df})
    with pytest.raises(ExchangeError, match="not a JSON document.*bytes"):
        ex.put_json("metrics", "evaluate.json", {**evaluation("eu"), "blob": b"eu-1,1.0\neu-2,2.0"})
    assert not (tmp_path / "jobs").exists()


@pytest.mark.parametrize(("where", "key"), [
    ("top", "rows"),
    ("shard", "rows"),
    ("stats", "amount"),
])
def test_put_json_refuses_short_record_lists_and_columns_naming_the_key(tmp_path: Path, where: str, key: str) -> None:
    ex = Exchange(store(tmp_path), "job-1", "eu")
    doc = prepare_stats("eu")
    records = [{"transaction_id": "eu-1", "amount": 1.0}, {"transaction_id": "eu-2", "amount": 2.0}]
    if where == "top":  # two records: short lists of rows are rows all the same
        doc["rows"] = records
    elif where == "shard":
        doc["shards"]["eu-000"]["rows"] = records
    else:  # a column: one feature's values, row by row
        doc["train_stats"]["amount"] = [float(i) for i in range(50)]
    with pytest.raises(ExchangeError, match=rf"stats/prepare.json of eu .*{key}: key not allowed by the protocol"):
        ex.put_json("stats", "prepare.json", doc)
    assert not (tmp_path / "jobs").exists()


def test_put_json_refuses_rows_in_typed_places(tmp_path: Path) -> None:
    ex = Exchange(store(tmp_path), "job-1", "eu")
    doc = evaluation("eu", {"round-0002": {**model_metrics(), "hist_pos": [{"amount": 1.0}], "hist_neg": [25]}})
    with pytest.raises(ExchangeError, match=r"models.round-0002.binary.hist_pos.0: Input should be a valid integer"):
        ex.put_json("metrics", "evaluate.json", doc)
    long_list = prepare_stats("eu", width=2000)  # the sums are one value per feature, of a bounded width
    with pytest.raises(ExchangeError, match="train_stats.sum: List should have at most 1024 items"):
        ex.put_json("stats", "prepare.json", long_list)
    with pytest.raises(ExchangeError, match="reason: String should have at most 2000 characters"):
        Exchange(store(tmp_path), "job-1", "coordinator").put_json("control", "abort.json", {"reason": "r," * 1001})
    assert not (tmp_path / "jobs").exists()


def test_strings_holding_data_are_refused_and_never_echoed(tmp_path: Path) -> None:
    ex = Exchange(store(tmp_path), "job-1", "eu")
    card = "4111111111111111,12.50,DE"
    doc = prepare_stats("eu")
    doc["shards"][card] = doc["shards"].pop("eu-000")
    with pytest.raises(ExchangeError, match=r"shards.<25 characters>.\[key\]: String should match pattern") as e:
        ex.put_json("stats", "prepare.json", doc)
    assert "4111" not in str(e.value)
    doc = prepare_stats("eu")
    doc["ran_as"]["os_user"] = card
    with pytest.raises(ExchangeError, match="ran_as.os_user: String should match pattern") as e:
        ex.put_json("stats", "prepare.json", doc)
    assert "4111" not in str(e.value)


def test_documents_must_be_where_they_say_they_belong(tmp_path: Path) -> None:
    eu = Exchange(store(tmp_path), "job-1", "eu")
    with pytest.raises(ExchangeError, match="its 'site' is 'us', not 'eu'"):
        eu.put_json("stats", "prepare.json", prepare_stats("us"))
    # a copy of us's document under eu's prefix (around the Exchange) is refused when read
    eu._put_bytes("stats", "prepare.json", json.dumps(prepare_stats("us")).encode())
    with pytest.raises(ExchangeError, match="its 'site' is 'us', not 'eu'"):
        Exchange(store(tmp_path), "job-1", "coordinator").get_json("stats", "prepare.json", writer="eu")


def test_each_artefact_has_one_writer_role(tmp_path: Path) -> None:
    eu = Exchange(store(tmp_path), "job-1", "eu")
    with pytest.raises(ExchangeError, match="plan/plan.json of eu: only the coordinator writes plan/plan.json"):
        eu.put_json("plan", "plan.json", {"job_id": "job-1"})
    with pytest.raises(ExchangeError, match="only the coordinator writes control/abort.json"):
        eu.put_json("control", "abort.json", {"reason": "stop"})
    with pytest.raises(ExchangeError, match="only the site writes stats/prepare.json"):
        Exchange(store(tmp_path), "job-1", "coordinator").put_json("stats", "prepare.json", prepare_stats("eu"))
    assert not (tmp_path / "jobs").exists()


@pytest.mark.parametrize(("kind", "name"), [("metrics", "m.json"), ("stats", "train.json"), ("update", "rows.bin"),
                                            ("summary", "rows.csv"), ("stats", "prepare.json.bak")])
def test_names_outside_the_protocol_are_refused_on_write_and_read(tmp_path: Path, kind: str, name: str) -> None:
    eu = Exchange(store(tmp_path), "job-1", "eu")
    with pytest.raises(ExchangeError, match="not an artefact of the exchange protocol"):
        eu.put_json(kind, name, {"auc": 0.9})
    eu._put_bytes(kind, name, b'{"auc": 0.9}')  # around the Exchange, as s3fs would
    with pytest.raises(ExchangeError, match="not an artefact of the exchange protocol"):
        Exchange(store(tmp_path), "job-1", "coordinator").get_json(kind, name, writer="eu")


def test_reads_are_checked_like_writes(tmp_path: Path) -> None:
    eu = Exchange(store(tmp_path), "job-1", "eu")
    coord = Exchange(store(tmp_path), "job-1", "coordinator")
    eu._put_bytes("stats", "prepare.json", json.dumps({**prepare_stats("eu"), "rows": [[1.0, 2.0]]}).encode())
    with pytest.raises(ExchangeError, match="stats/prepare.json of eu .*rows: key not allowed by the protocol"):
        coord.get_json("stats", "prepare.json", writer="eu")
    eu._put_bytes("stats", "prepare.json", b"transaction_id,amount\neu-1,1.0\n")  # a CSV under a protocol name
    with pytest.raises(ExchangeError, match="Invalid JSON"):
        coord.get_json("stats", "prepare.json", writer="eu")
    # an oversized document is refused before it is parsed (64 KiB for prepare.json)
    eu._put_bytes("stats", "prepare.json", json.dumps(prepare_stats("eu")).encode() + b" " * 70_000)
    with pytest.raises(ExchangeError, match="more than 65,536 bytes"):
        coord.get_json("stats", "prepare.json", writer="eu")


@pytest.mark.parametrize("kind", ["raw", "data", "prepared", "rows", ""])
def test_unknown_kinds_are_refused(tmp_path: Path, kind: str) -> None:
    ex = Exchange(store(tmp_path), "job-1", "eu")
    with pytest.raises(ExchangeError, match="may not be written to the exchange"):
        ex.put_json(kind, "x.json", {"a": 1})
    with pytest.raises(ExchangeError, match="may not be written to the exchange"):
        ex._put_bytes(kind, "x.bin", b"123")
    assert kind not in KINDS
    assert not (tmp_path / "jobs").exists()


def test_abort_reason_is_cut_to_what_the_protocol_allows(tmp_path: Path) -> None:
    coord = Exchange(store(tmp_path), "job-1", "coordinator")
    coord.put_abort("QuorumError: " + "x" * 5000)
    reason = Exchange(store(tmp_path), "job-1", "eu").get_json("control", "abort.json", writer="coordinator")["reason"]
    assert reason.startswith("QuorumError: xxx") and reason.endswith("…") and len(reason) == 2000


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
    s = store(tmp_path)
    coord = Exchange(s, "j1", "coordinator")
    eu = Exchange(s, "j1", "eu")
    us = Exchange(s, "j1", "us")
    other_job = Exchange(s, "j10", "eu")  # a prefix of j1's name must not leak into j1's ledger

    ref, base = publish_global(tmp_path, job="j1")
    coord.put_abort("stop")
    eu.put_json("stats", "prepare.json", prepare_stats("eu"))
    publish_update(tmp_path, "eu", 0, ref, ref, base, job="j1")
    publish_update(tmp_path, "eu", 1, ref, ref, base, job="j1")
    us.put_json("metrics", "evaluate.json", evaluation("us"))
    us._put_bytes("update", "blob.pt", b"x" * 4321)  # bytes around the protocol are counted all the same
    other_job._put_bytes("update", "big.pt", b"y" * 100_000)
    other_job.put_json("metrics", "evaluate.json", evaluation("eu"))

    expected = _sizes_on_disk(tmp_path, "j1")
    assert set(expected) == {"coordinator", "eu", "us"}
    assert expected["us"]["update"] == 4321
    # the update kind of eu holds two .pt files and two manifests
    eu_update = tmp_path / "jobs/j1/update/eu"
    assert len(list(eu_update.iterdir())) == 4
    assert expected["eu"]["update"] == sum(os.path.getsize(p) for p in eu_update.iterdir())

    ledger = eu.ledger()
    assert ledger == expected
    assert coord.ledger() == expected  # whoever asks, the job's ledger is the same
    evaluated = len(json.dumps(evaluation("eu"), sort_keys=True))
    assert other_job.ledger() == _sizes_on_disk(tmp_path, "j10") == {"eu": {"update": 100_000, "metrics": evaluated}}
    assert Exchange(s, "never-ran", "eu").ledger() == {}


def test_strays_name_every_object_outside_the_protocol(tmp_path: Path) -> None:
    s = store(tmp_path)
    ref, base = publish_global(tmp_path)
    publish_update(tmp_path, "eu", 0, ref, ref, base)
    eu = Exchange(s, "job-1", "eu")
    eu.put_json("stats", "prepare.json", prepare_stats("eu"))
    assert eu.strays() == []
    eu._put_bytes("update", "rows.csv", b"a,b\n1,2\n")
    eu._put_bytes("plan", "plan.json", b"{}")  # a protocol name, but not a site's to write
    eu.fs.makedirs(eu.store.path("jobs/job-1/stats/eu/deeper"), exist_ok=True)
    eu.fs.pipe(eu.store.path("jobs/job-1/stats/eu/deeper/x.json"), b"{}")
    assert eu.strays() == ["plan/eu/plan.json is not an artefact of the protocol",
                           "stats/eu/deeper/x.json is not an artefact of the protocol",
                           "update/eu/rows.csv is not an artefact of the protocol"]


def test_list_is_sorted_and_scoped(tmp_path: Path) -> None:
    s = store(tmp_path)
    a, b = Exchange(s, "j1", "eu"), Exchange(s, "j1", "us")
    b._put_bytes("update", "2.bin", b"2")
    a._put_bytes("update", "1.bin", b"1")
    a._put_bytes("metrics", "m.json", b"{}")
    listed = a.list("update")
    assert [p.rsplit("/", 2)[-2:] for p in listed] == [["eu", "1.bin"], ["us", "2.bin"]]
    assert [p.rsplit("/", 1)[-1] for p in a.list("update", writer="us")] == ["2.bin"]
    assert a.list("plan") == []


def test_wait_for_times_out_quickly(tmp_path: Path) -> None:
    ex = Exchange(store(tmp_path), "job-1", "coordinator")
    t0 = time.monotonic()
    assert ex.wait_for("update", "round-0000.manifest.json", writer="eu", timeout=0.3, poll=0.05) is False
    elapsed = time.monotonic() - t0
    assert 0.3 <= elapsed < 2.0


def test_wait_for_sees_existing_artefact(tmp_path: Path) -> None:
    ref, base = publish_global(tmp_path)
    publish_update(tmp_path, "eu", 0, ref, ref, base)
    ex = Exchange(store(tmp_path), "job-1", "coordinator")
    t0 = time.monotonic()
    assert ex.wait_for("update", "round-0000.manifest.json", writer="eu", timeout=5.0)
    assert time.monotonic() - t0 < 1.0
