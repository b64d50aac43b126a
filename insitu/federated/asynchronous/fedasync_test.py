"""FedAsync: every update within the staleness bound is mixed in at once, weighted by α·s(τ)."""

from __future__ import annotations

import pytest
import torch

from insitu.conf import AsyncConfig, StalenessConfig
from insitu.federated.asynchronous import FedAsync, ServerState, SiteUpdate, build_algorithm


def _cfg(**kw: object) -> AsyncConfig:
    return AsyncConfig(algorithm="fedasync", **kw)  # type: ignore[arg-type]


def _update(site: str, seq: int, base_version: int, value: float, base: float = 0.0) -> SiteUpdate:
    return SiteUpdate(site, seq, base_version, {"w": torch.tensor([value, value])},
                      {"w": torch.tensor([base, base])}, 100)


def test_fresh_update_mixes_with_alpha() -> None:
    algo = build_algorithm(_cfg(alpha=0.5, staleness=StalenessConfig(function="constant")))
    assert isinstance(algo, FedAsync)
    d = algo.receive(ServerState(), {"w": torch.tensor([0.0, 2.0])}, _update("eu", 0, 0, 4.0))
    assert torch.equal(d.global_state["w"], torch.tensor([2.0, 3.0]))  # 0.5*0 + 0.5*4, 0.5*2 + 0.5*4
    assert d.state.version == 1 and d.receipt.accepted and d.receipt.new_version
    assert d.receipt.staleness == 0 and d.receipt.weight == 0.5
    assert [e.site for e in d.receipt.applied] == ["eu"]


def test_stale_update_counts_less() -> None:
    algo = build_algorithm(_cfg(alpha=0.8, staleness=StalenessConfig(function="polynomial", a=1.0)))
    d = algo.receive(ServerState(version=3), {"w": torch.zeros(2)}, _update("us", 5, 1, 10.0))
    # staleness 2: α_t = 0.8 / 3
    assert d.receipt.staleness == 2 and d.receipt.weight == pytest.approx(0.8 / 3)
    assert torch.allclose(d.global_state["w"], torch.full((2,), 10 * 0.8 / 3))
    assert d.state.version == 4


def test_beyond_max_staleness_is_refused_and_nothing_changes() -> None:
    algo = build_algorithm(_cfg(max_staleness=1))
    server = ServerState(version=5)
    d = algo.receive(server, {"w": torch.zeros(2)}, _update("us", 2, 3, 1.0))
    assert not d.receipt.accepted and d.global_state is None and d.state is server
    assert "max_staleness 1" in d.receipt.reason and "refresh to version 5" in d.receipt.reason
    assert d.receipt.version == 5 and not d.receipt.new_version


def test_max_staleness_zero_accepts_only_the_newest() -> None:
    algo = build_algorithm(_cfg(max_staleness=0))
    assert algo.receive(ServerState(version=2), {"w": torch.zeros(2)}, _update("eu", 0, 2, 1.0)).receipt.accepted
    assert not algo.receive(ServerState(version=2), {"w": torch.zeros(2)}, _update("eu", 0, 1, 1.0)).receipt.accepted


def test_an_update_from_the_future_is_an_error() -> None:
    with pytest.raises(ValueError, match="claims base version 4"):
        build_algorithm(_cfg()).receive(ServerState(version=3), {"w": torch.zeros(2)}, _update("eu", 0, 4, 1.0))


def test_an_update_of_another_shape_is_an_error() -> None:
    bad = SiteUpdate("eu", 0, 0, {"w": torch.zeros(3)}, {"w": torch.zeros(2)}, 100)
    with pytest.raises(ValueError, match="shape"):
        build_algorithm(_cfg()).receive(ServerState(), {"w": torch.zeros(2)}, bad)


def test_dtypes_are_kept() -> None:
    g = {"w": torch.zeros(2, dtype=torch.float32), "n": torch.tensor(3)}
    up = SiteUpdate("eu", 0, 0, {"w": torch.ones(2), "n": torch.tensor(7)}, g, 100)
    out = build_algorithm(_cfg()).receive(ServerState(), g, up).global_state
    assert out["w"].dtype == torch.float32 and out["n"].dtype == torch.int64 and int(out["n"]) == 7


def test_receive_is_pure() -> None:
    g = {"w": torch.zeros(2)}
    server = ServerState(version=1)
    algo = build_algorithm(_cfg())
    a = algo.receive(server, g, _update("eu", 0, 1, 1.0))
    b = algo.receive(server, g, _update("eu", 0, 1, 1.0))
    assert server.version == 1 and torch.equal(g["w"], torch.zeros(2))
    assert torch.equal(a.global_state["w"], b.global_state["w"])
