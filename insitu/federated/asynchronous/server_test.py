"""The parameter server over a real (file://) exchange: decisions, refusals with their notice, resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from insitu.conf import AsyncConfig
from insitu.federated.asynchronous import build_algorithm
from insitu.federated.asynchronous.server import ParameterServer
from insitu.federated.exchange import Exchange
from insitu.federated.kinds import COORDINATOR, ExchangeError
from insitu.federated.paths import ASYNC_STATE, NEWEST, async_update, global_weights, refresh
from insitu.federated.schemas import artefact
from insitu.storage import Store

SITES = ["eu", "us"]
G0 = {"w": torch.zeros(2)}


def _ex(tmp_path: Path, writer: str) -> Exchange:
    return Exchange(Store(f"file://{tmp_path}/", {}), "job-1", writer)


def _server(tmp_path: Path, target: int = 3, **cfg: object) -> ParameterServer:
    coord = _ex(tmp_path, COORDINATOR)
    if not coord.exists(global_weights(0).manifest):
        coord.put_state(global_weights(0), G0, round=0)
    return ParameterServer(coord, build_algorithm(AsyncConfig(**cfg)), SITES, target, update_limit=10)  # type: ignore[arg-type]


def _push(tmp_path: Path, site: str, seq: int, base_version: int, value: float) -> None:
    site_ex = _ex(tmp_path, site)
    base, man = site_ex.get_state(global_weights(base_version), writer=COORDINATOR)
    site_ex.put_state(async_update(seq), {"w": base["w"] + value}, reference=base, seq=seq,
                      base_version=base_version, n_samples=100, base_sha256=man["sha256"],
                      metrics={"train_loss": 0.5})


def _step(server: ParameterServer) -> dict | None:
    (first, *_) = server.wait(2.0)
    return server.commit(server.decide(first))


def test_fedasync_applies_each_update_and_moves_the_newest_pointer(tmp_path: Path) -> None:
    server = _server(tmp_path, algorithm="fedasync", alpha=0.5, staleness={"function": "constant"})
    assert _ex(tmp_path, "eu").get_json(NEWEST, writer=COORDINATOR)["version"] == 0
    _push(tmp_path, "eu", 0, 0, 2.0)
    result = _step(server)
    assert result is not None and result["round"] == 0 and result["sites"] == ["eu"]
    assert result["site_metrics"]["eu"]["async_staleness"] == 0 and result["site_metrics"]["eu"]["train_loss"] == 0.5
    state, man = _ex(tmp_path, "us").get_state(global_weights(1), writer=COORDINATOR)
    assert torch.equal(state["w"], torch.ones(2)) and man["applied"][0]["weight"] == 0.5
    newest = _ex(tmp_path, "us").get_json(NEWEST, writer=COORDINATOR)
    assert newest == {"version": 1, "sha256": man["sha256"], "target": 3}
    # us trained from version 0: staleness 1, within the default bound
    _push(tmp_path, "us", 0, 0, 4.0)
    result = _step(server)
    assert result is not None and result["site_metrics"]["us"]["async_staleness"] == 1
    assert server.version == 2 and [r["round"] for r in server.results()] == [0, 1]


def test_a_too_stale_update_is_refused_and_the_site_told_to_refresh(tmp_path: Path) -> None:
    server = _server(tmp_path, max_staleness=0)
    _push(tmp_path, "eu", 0, 0, 1.0)
    _step(server)
    _push(tmp_path, "us", 0, 0, 1.0)  # trained from version 0, but version 1 is out
    pending = server.decide(server.wait(2.0)[0])
    assert not pending.receipt.accepted and "max_staleness 0" in pending.receipt.reason
    assert server.commit(pending) is None and server.version == 1
    notice = _ex(tmp_path, "us").get_json(refresh("us"), writer=COORDINATOR)
    assert notice["recipient"] == "us" and notice["seq"] == 0 and notice["version"] == 1 and notice["staleness"] == 1
    doc = _ex(tmp_path, COORDINATOR).get_json(ASYNC_STATE)
    assert doc["next_seq"] == {"eu": 1, "us": 1} and doc["refused"] == {"eu": 0, "us": 1}
    assert server.arrivals() == []  # decided: not offered again


def test_an_update_from_other_weights_is_refused_as_invalid(tmp_path: Path) -> None:
    server = _server(tmp_path)
    site_ex = _ex(tmp_path, "eu")
    site_ex.put_state(async_update(0), {"w": torch.ones(2)}, reference=G0, seq=0, base_version=0, n_samples=100,
                      base_sha256="0" * 64)
    pending = server.decide(server.wait(2.0)[0])
    assert not pending.receipt.accepted and "invalid update" in pending.receipt.reason
    server.commit(pending)
    assert site_ex.exists(refresh("eu"), writer=COORDINATOR)


def test_a_resumed_server_continues_fedbuffs_buffer_exactly(tmp_path: Path) -> None:
    cfg = {"algorithm": "fedbuff", "buffer_size": 2, "alpha": 1.0}
    first = tmp_path / "a"
    server = _server(first, **cfg)
    _push(first, "eu", 0, 0, 2.0)
    assert _step(server) is None and len(server.state.buffer) == 1
    resumed = _server(first, **cfg)  # a new coordinator process on the same exchange
    assert resumed.decisions == 1 and resumed.next_seq == {"eu": 1, "us": 0} and len(resumed.state.buffer) == 1
    _push(first, "us", 0, 0, 4.0)
    assert _step(resumed) is not None and resumed.version == 1

    straight = tmp_path / "b"
    server = _server(straight, **cfg)
    _push(straight, "eu", 0, 0, 2.0)
    _step(server)
    _push(straight, "us", 0, 0, 4.0)
    _step(server)
    a = _ex(first, "eu").get_state(global_weights(1), writer=COORDINATOR)[0]
    b = _ex(straight, "eu").get_state(global_weights(1), writer=COORDINATOR)[0]
    assert torch.equal(a["w"], b["w"]) and torch.equal(a["w"], torch.full((2,), 3.0))


def test_a_resumed_server_reports_earlier_versions_as_resumed(tmp_path: Path) -> None:
    server = _server(tmp_path)
    _push(tmp_path, "eu", 0, 0, 1.0)
    _step(server)
    again = _server(tmp_path)
    assert again.version == 1 and [r["resumed"] for r in again.results()] == [True]


def test_the_async_objects_are_the_protocols() -> None:
    # only the coordinator writes the pointer, its state, notices and the buffer; only a site its updates
    for doc in (NEWEST, ASYNC_STATE, refresh("us")):
        assert artefact(doc.kind, doc.name, COORDINATOR).schema is not None
        with pytest.raises(ExchangeError, match="only the coordinator"):
            artefact(doc.kind, doc.name, "us")
    with pytest.raises(ExchangeError, match="only the site"):
        artefact("update", async_update(3).manifest.name, COORDINATOR)


def test_a_notice_must_be_addressed_to_the_site_it_is_named_for(tmp_path: Path) -> None:
    notice = {"recipient": "eu", "seq": 0, "base_version": 0, "version": 2, "staleness": 2, "reason": "stale"}
    with pytest.raises(ExchangeError, match="recipient"):
        _ex(tmp_path, COORDINATOR).put_json(refresh("us"), notice)


def test_an_update_manifest_names_its_own_sequence_number(tmp_path: Path) -> None:
    _server(tmp_path)
    site_ex = _ex(tmp_path, "eu")
    base, man = site_ex.get_state(global_weights(0), writer=COORDINATOR)
    with pytest.raises(ExchangeError, match="must have seq"):
        site_ex.put_state(async_update(1), {"w": base["w"] + 1}, reference=base, seq=2, base_version=0,
                          n_samples=100, base_sha256=man["sha256"])
