"""Model states on the exchange: plain finite tensors; an update has the global model's layout, within a norm bound."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
import torch
from protocol_examples import global_state, publish_global, publish_update, shifted, store

from insitu.federated.exchange import Exchange, ExchangeError, state_to_bytes
from insitu.federated.kinds import MAX_UPDATE_NORM
from insitu.federated.states import check_state, delta_norm

REF = {"a.weight": torch.ones(2, 3), "a.bias": torch.zeros(2), "steps": torch.tensor(4)}


def test_a_state_like_the_global_one_passes() -> None:
    check_state({k: v.clone() for k, v in REF.items()}, "u", REF, max_norm=0.0)
    check_state(shifted(global_state(), 0.5), "u", global_state(), MAX_UPDATE_NORM)


@pytest.mark.parametrize(("state", "message"), [
    ({**REF, "rows": torch.tensor([[4111.0, 12.5]])}, r"u: parameters differ from the global model's: extra \['rows'"),
    ({k: v for k, v in REF.items() if k != "steps"}, r"missing \['steps'\]"),
    (dict(reversed(REF.items())), "the same names in another order"),
    ({**REF, "a.bias": torch.zeros(3)}, r"'a.bias' has shape \(3,\); the global model's is \(2,\)"),
    ({**REF, "a.weight": torch.ones(3, 2)}, r"'a.weight' has shape \(3, 2\)"),
    ({**REF, "a.bias": torch.zeros(2, dtype=torch.float64)}, "'a.bias' has dtype torch.float64"),
    ({**REF, "a.bias": torch.tensor([0.0, float("nan")])}, "'a.bias' holds NaN or infinite values"),
    ({**REF, "a.bias": torch.tensor([0.0, float("inf")])}, "'a.bias' holds NaN or infinite values"),
    ({**REF, "a.bias": torch.tensor([0.0, 200.0])}, r"\|\|update - global\|\|_2 = 200 exceeds the bound 100"),
])
def test_an_update_unlike_the_global_model_is_refused(state: dict[str, torch.Tensor], message: str) -> None:
    with pytest.raises(ExchangeError, match=message):
        check_state(state, "u", REF, MAX_UPDATE_NORM)


@pytest.mark.parametrize(("state", "message"), [
    ({}, "a non-empty mapping"),
    ([torch.zeros(2)], "not list"),
    ({"w": [1.0, 2.0]}, "'w' is a list, not a dense tensor"),
    ({"w": torch.zeros(2).to_sparse()}, "'w' is a Tensor, not a dense tensor"),
    ({"w": torch.tensor([1 + 2j])}, "'w' has dtype torch.complex64"),
    ({"w": torch.tensor([True])}, "'w' has dtype torch.bool"),
    ({"4111 1111 1111 1111": torch.zeros(1)}, "key <19 characters> is not a parameter name"),
    ({f"p{i}": torch.zeros(1) for i in range(1025)}, "1025 tensors"),
])
def test_anything_but_a_plain_finite_state_is_refused(state: object, message: str) -> None:
    with pytest.raises(ExchangeError, match=message):
        check_state(state, "w", None)


def test_the_norm_is_over_every_float_tensor() -> None:
    state = {**REF, "a.weight": REF["a.weight"] + 1.0, "a.bias": torch.tensor([3.0, 4.0]), "steps": torch.tensor(9)}
    assert delta_norm(state, REF) == pytest.approx(math.sqrt(6 + 25))  # integer counters are not weights
    with pytest.raises(ExchangeError, match="exceeds the bound 5"):
        check_state(state, "u", REF, max_norm=5.0)
    check_state(state, "u", REF, max_norm=6.0)


def test_an_update_is_checked_before_anything_is_written(tmp_path: Path) -> None:
    ref, base = publish_global(tmp_path)
    eu = Exchange(store(tmp_path), "job-1", "eu")
    with pytest.raises(ExchangeError, match="pass them as reference="):
        eu.put_state("update", "round-0000", ref, round=0, n_samples=100, base_sha256=base)
    with pytest.raises(ExchangeError, match=r"update/round-0000.pt of eu .*extra \['rows'\]"):
        eu.put_state("update", "round-0000", {**ref, "rows": torch.zeros(5, 3)}, reference=ref, round=0,
                     n_samples=100, base_sha256=base)
    with pytest.raises(ExchangeError, match="exceeds the bound 1"):
        eu.put_state("update", "round-0000", shifted(ref, 10.0), reference=ref, max_norm=1.0, round=0,
                     n_samples=100, base_sha256=base)
    # the manifest is checked before the state file is written, too: an update from too few rows, a stray key
    with pytest.raises(ExchangeError, match="n_samples: Input should be greater than or equal to 20"):
        eu.put_state("update", "round-0000", ref, reference=ref, round=0, n_samples=3, base_sha256=base)
    with pytest.raises(ExchangeError, match="rows: key not allowed by the protocol"):
        eu.put_state("update", "round-0000", ref, reference=ref, round=0, n_samples=100, base_sha256=base,
                     rows=[[1.0, 2.0]])
    with pytest.raises(ExchangeError, match="metrics.amount: key not allowed by the protocol"):
        eu.put_state("update", "round-0000", ref, reference=ref, round=0, n_samples=100, base_sha256=base,
                     metrics={"amount": 12.5})
    with pytest.raises(ExchangeError, match="an update named round-0000 must be for round 0"):
        eu.put_state("update", "round-0000", ref, reference=ref, round=1, n_samples=100, base_sha256=base)
    assert not (tmp_path / "jobs/job-1/update").exists()


def test_a_state_written_around_the_exchange_is_checked_on_read(tmp_path: Path) -> None:
    ref, base = publish_global(tmp_path)
    publish_update(tmp_path, "eu", 0, ref, ref, base)
    eu = Exchange(store(tmp_path), "job-1", "eu")
    bad = {**ref, "fc.bias": torch.tensor([float("nan"), 0.0])}
    data = state_to_bytes(bad)
    eu._put_bytes("update", "round-0000.pt", data)
    man = json.loads((tmp_path / "jobs/job-1/update/eu/round-0000.manifest.json").read_text())
    man.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    eu._put_bytes("update", "round-0000.manifest.json", json.dumps(man).encode())
    coord = Exchange(store(tmp_path), "job-1", "coordinator")
    with pytest.raises(ExchangeError, match="update/round-0000.pt of eu .*'fc.bias' holds NaN"):
        coord.get_state("update", "round-0000", writer="eu", reference=ref)
    with pytest.raises(ExchangeError, match="'fc.bias' holds NaN"):  # finite values are checked on every read
        coord.get_state("update", "round-0000", writer="eu")


def test_a_state_file_that_is_not_a_state_is_refused(tmp_path: Path) -> None:
    ref, base = publish_global(tmp_path)
    publish_update(tmp_path, "eu", 0, ref, ref, base)
    eu = Exchange(store(tmp_path), "job-1", "eu")
    data = b"transaction_id,amount\neu-1,12.50\n"  # raw rows under the update's name, with a matching manifest
    eu._put_bytes("update", "round-0000.pt", data)
    man = json.loads((tmp_path / "jobs/job-1/update/eu/round-0000.manifest.json").read_text())
    man.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    eu._put_bytes("update", "round-0000.manifest.json", json.dumps(man).encode())
    with pytest.raises(ExchangeError, match="update/round-0000.pt of eu .*not a state file"):
        Exchange(store(tmp_path), "job-1", "coordinator").get_state("update", "round-0000", writer="eu", reference=ref)


def test_a_state_file_longer_than_its_manifest_says_is_not_read_whole(tmp_path: Path) -> None:
    ref, base = publish_global(tmp_path)
    man = publish_update(tmp_path, "eu", 0, ref, ref, base)
    pt = tmp_path / "jobs/job-1/update/eu/round-0000.pt"
    pt.write_bytes(pt.read_bytes() + b"\0" * 10_000)
    with pytest.raises(ExchangeError, match=f"more than {man['bytes']:,} bytes; refused"):
        Exchange(store(tmp_path), "job-1", "coordinator").get_state("update", "round-0000", writer="eu")
