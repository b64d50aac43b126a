"""Encoded updates on the exchange: a site writes one, the coordinator reads it back decoded and checked, a round
aggregates decoded updates, and every payload of another form, or of another encoding, is refused.

A site's residual (error feedback) stays in its own store: the newest earlier one is read, never its own.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from protocol_examples import ran_as, store
from safetensors.torch import save

from insitu.federated.codecs import UpdateEncoding, build_codec
from insitu.federated.exchange import Exchange, state_to_bytes
from insitu.federated.feedback import load_residual, save_residual
from insitu.federated.kinds import ExchangeError
from insitu.federated.rounds import round_name, run_round
from insitu.federated.state_bytes import payload_to_bytes

G = torch.Generator().manual_seed(0)
GLOBAL = {"fc.weight": torch.randn(128, 64, generator=G), "fc.bias": torch.zeros(128),
          "bn.num_batches_tracked": torch.tensor(0)}
INT8 = UpdateEncoding(build_codec("int8"))


def _ex(tmp_path: Path, writer: str) -> Exchange:
    return Exchange(store(tmp_path), "job-1", writer)


def _base(tmp_path: Path) -> str:
    coord = _ex(tmp_path, "coordinator")
    if not coord.exists("weights", "round-0000.manifest.json"):
        coord.put_state("weights", "round-0000", GLOBAL, round=0)
    return coord.get_json("weights", "round-0000.manifest.json")["sha256"]


def _trained(step: float, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + step * torch.randn(v.shape, generator=g) if v.is_floating_point() else v + 3
            for k, v in GLOBAL.items()}


def _publish(tmp_path: Path, site: str, state: dict[str, torch.Tensor], encoding: UpdateEncoding | None,
             n: int = 500) -> dict:
    base = _base(tmp_path)
    payload = encoding.encode(state, GLOBAL)[0] if encoding else state
    return _ex(tmp_path, site).put_state("update", round_name(0), payload, reference=GLOBAL, encoding=encoding,
                                         n_samples=n, round=0, base_sha256=base)


def _forge(tmp_path: Path, site: str, data: bytes, encoding: str | None = "int8-delta") -> None:
    """An update written around the Exchange (as a site could with s3fs): a consistent manifest, any bytes."""
    ex = _ex(tmp_path, site)
    ex._put_bytes("update", "round-0000.pt", data)
    manifest = {"job_id": "job-1", "writer": site, "name": "round-0000", "round": 0, "n_samples": 500,
                "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "created": "2025-01-01T00:00:00+00:00",
                "base_sha256": _base(tmp_path), "ran_as": ran_as(site), "encoding": encoding}
    ex._put_bytes("update", "round-0000.manifest.json", json.dumps(manifest).encode())


def test_an_int8_update_crosses_in_about_a_quarter_of_the_bytes_and_reads_back_decoded(tmp_path: Path) -> None:
    trained = _trained(0.01, 1)
    man = _publish(tmp_path, "eu", trained, INT8)
    assert man["encoding"] == "int8-delta"
    fp32 = sum(v.numel() * 4 for v in GLOBAL.values() if v.is_floating_point())
    assert man["bytes"] < 0.27 * fp32
    state, read = _ex(tmp_path, "coordinator").get_state("update", "round-0000", "eu", reference=GLOBAL,
                                                          encoding=INT8)
    assert read["encoding"] == "int8-delta"
    assert list(state) == list(GLOBAL) and int(state["bn.num_batches_tracked"]) == 3
    assert float((state["fc.weight"] - trained["fc.weight"]).abs().max()) < 0.01 * 4 / 127  # half a scale, bounded


def test_a_reader_refuses_an_update_of_another_encoding(tmp_path: Path) -> None:
    _publish(tmp_path, "eu", _trained(0.01, 1), None)
    _publish(tmp_path, "us", _trained(0.01, 2), INT8)
    coord = _ex(tmp_path, "coordinator")
    with pytest.raises(ExchangeError, match="encoded as a full state dict; this job's updates are int8-delta"):
        coord.get_state("update", "round-0000", "eu", reference=GLOBAL, encoding=INT8)
    with pytest.raises(ExchangeError, match="encoded as int8-delta; this job's updates are full state dicts"):
        coord.get_state("update", "round-0000", "us", reference=GLOBAL)
    with pytest.raises(ExchangeError, match="encoded as int8-delta; this job's updates are topk-delta"):
        coord.get_state("update", "round-0000", "us", reference=GLOBAL,
                        encoding=UpdateEncoding(build_codec("topk")))


def test_forged_payloads_are_refused_before_any_aggregator_sees_them(tmp_path: Path) -> None:
    coord = _ex(tmp_path, "coordinator")
    payload = INT8.encode(_trained(0.01, 1), GLOBAL)[0]
    cases = {
        "extra \\['rows'\\]": payload_to_bytes({**payload, "rows": torch.arange(100.0)}),
        "its layout says": payload_to_bytes({**payload, "values": torch.zeros(10, dtype=torch.int8)}),
        "not an encoded update": state_to_bytes(payload),  # a pickle, not safetensors
        "exceeds the bound": payload_to_bytes({**payload, "scales": payload["scales"] * 1e6}),
        "a header with metadata": save(payload, metadata={"rows": "alice,1970-01-01,4111111111111111"}),
    }
    for why, data in cases.items():
        _forge(tmp_path, "eu", data)
        with pytest.raises(ExchangeError, match=why):
            coord.get_state("update", "round-0000", "eu", reference=GLOBAL, max_norm=1e4, encoding=INT8)


def test_the_site_refuses_to_publish_a_payload_that_does_not_decode(tmp_path: Path) -> None:
    payload = INT8.encode(_trained(0.01, 1), GLOBAL)[0]
    with pytest.raises(ExchangeError, match="extra \\['rows'\\]"):
        _ex(tmp_path, "eu").put_state("update", round_name(0), {**payload, "rows": torch.zeros(3)}, reference=GLOBAL,
                                      encoding=INT8, n_samples=500, round=0, base_sha256=_base(tmp_path))
    assert not _ex(tmp_path, "eu").exists("update", "round-0000.pt")


def test_a_round_aggregates_the_decoded_updates(tmp_path: Path) -> None:
    plain = {}
    for i, site in enumerate(["eu", "us"]):
        plain[site] = _trained(0.01, 10 + i)
        _publish(tmp_path, site, plain[site], INT8)
    res = run_round(_ex(tmp_path, "coordinator"), 0, ["eu", "us"], min_sites=2, deadline_s=1, encoding=INT8)
    assert res.sites == ["eu", "us"]
    new, _ = _ex(tmp_path, "eu").get_state("weights", "round-0001", "coordinator")
    expected = (plain["eu"]["fc.weight"] + plain["us"]["fc.weight"]) / 2
    assert float((new["fc.weight"] - expected).abs().max()) < 0.01 * 4 / 127


def test_the_residual_read_is_the_newest_earlier_one_never_the_update_s_own(tmp_path: Path) -> None:
    s = store(tmp_path)
    assert load_residual(s, "job-1", "round-0000", 4) is None
    save_residual(s, "job-1", "round-0000", torch.full((4,), 1.0))
    save_residual(s, "job-1", "round-0002", torch.full((4,), 2.0))
    save_residual(s, "job-1", "async-000001", torch.full((4,), 9.0))  # another kind of update: never mixed in
    assert torch.equal(load_residual(s, "job-1", "round-0003", 4), torch.full((4,), 2.0))
    assert torch.equal(load_residual(s, "job-1", "round-0002", 4), torch.full((4,), 1.0))  # a retry of round 2
    assert torch.equal(load_residual(s, "job-1", "round-0001", 4), torch.full((4,), 1.0))  # round 1 was missed
    save_residual(s, "job-1", "round-0003", torch.full((4,), 3.0))  # round 0's is dropped: nothing reads it again
    assert sorted(p.rsplit("/", 1)[-1] for p in s.fs.glob(s.path("checkpoints/job-1/feedback/round-*"))) == \
        ["round-0002.safetensors", "round-0003.safetensors"]
    assert load_residual(s, "job-1", "round-0003", 5) is None  # another model's residual: restart from zero
    assert load_residual(s, "job-2", "round-0003", 4) is None
