"""FedBuff: K staleness-weighted deltas, then one server step; the buffer survives a serialisation."""

from __future__ import annotations

import torch

from insitu.conf import AsyncConfig, StalenessConfig, TrainingConfig
from insitu.federated.asynchronous import FedBuff, ServerState, SiteUpdate, build_algorithm, update_limit
from insitu.federated.kinds import async_update_limit


def _algo(**kw: object) -> FedBuff:
    algo = build_algorithm(AsyncConfig(algorithm="fedbuff", **kw))  # type: ignore[arg-type]
    assert isinstance(algo, FedBuff)
    return algo


def _update(site: str, seq: int, base_version: int, value: float, base: float) -> SiteUpdate:
    return SiteUpdate(site, seq, base_version, {"w": torch.tensor([value])}, {"w": torch.tensor([base])}, 100)


def test_buffers_then_steps_with_the_mean_delta() -> None:
    algo = _algo(buffer_size=2, alpha=1.0, staleness=StalenessConfig(function="constant"))
    g = {"w": torch.tensor([10.0])}
    d1 = algo.receive(ServerState(), g, _update("eu", 0, 0, 12.0, 10.0))  # delta +2
    assert d1.receipt.accepted and not d1.receipt.new_version and d1.global_state is None
    assert d1.state.version == 0 and len(d1.state.buffer) == 1
    d2 = algo.receive(d1.state, g, _update("us", 0, 0, 6.0, 10.0))  # delta -4
    assert d2.receipt.new_version and d2.state.version == 1 and d2.state.buffer == ()
    assert torch.allclose(d2.global_state["w"], torch.tensor([10.0 + (2 - 4) / 2]))
    assert [e.site for e in d2.receipt.applied] == ["eu", "us"]


def test_deltas_are_from_each_updates_own_base_and_weighted_by_staleness() -> None:
    algo = _algo(buffer_size=2, alpha=0.5, staleness=StalenessConfig(function="polynomial", a=1.0))
    g = {"w": torch.tensor([0.0])}
    d1 = algo.receive(ServerState(version=2), g, _update("eu", 0, 2, 4.0, 0.0))  # τ 0: s 1, Δ 4
    d2 = algo.receive(d1.state, g, _update("us", 3, 1, 9.0, 3.0))  # τ 1: s 1/2, Δ 6 → 3
    assert d2.receipt.weight == 0.5
    assert torch.allclose(d2.global_state["w"], torch.tensor([0.5 * (4 + 3) / 2]))
    assert d2.state.version == 3


def test_refused_updates_stay_out_of_the_buffer() -> None:
    algo = _algo(buffer_size=2, max_staleness=0)
    d = algo.receive(ServerState(version=1), {"w": torch.zeros(1)}, _update("us", 0, 0, 1.0, 0.0))
    assert not d.receipt.accepted and d.state.buffer == ()


def test_a_serialised_state_continues_exactly() -> None:
    algo = _algo(buffer_size=3, alpha=1.0)
    g = {"w": torch.tensor([1.0, 2.0])}
    ups = [SiteUpdate(s, i, 0, {"w": torch.tensor([v, -v])}, g, 50) for i, (s, v) in
           enumerate([("eu", 3.0), ("us", 5.0), ("apac", 0.5)])]
    straight = ServerState()
    for u in ups:
        d = algo.receive(straight, g, u)
        straight = d.state
    # interrupted after the second update: JSON plus tensors, as the exchange keeps them
    mid = algo.receive(algo.receive(ServerState(), g, ups[0]).state, g, ups[1]).state
    doc = mid.to_json()
    assert doc == {"version": 0, "buffer": [
        {"site": "eu", "seq": 0, "base_version": 0, "staleness": 0, "weight": 1.0},
        {"site": "us", "seq": 1, "base_version": 0, "staleness": 0, "weight": 1.0}]}
    resumed = ServerState.from_json(doc, {k: v.clone() for k, v in mid.buffer_sum.items()})
    r = algo.receive(resumed, g, ups[2])
    assert torch.equal(r.global_state["w"], d.global_state["w"]) and r.state == straight


def test_a_version_takes_a_buffer_of_updates_and_bounds_what_a_site_may_push() -> None:
    assert _algo(buffer_size=3).updates_per_version == 3
    assert build_algorithm(AsyncConfig(algorithm="fedasync")).updates_per_version == 1
    fedbuff = TrainingConfig(rounds=4, federation={"mode": "async", "asynchronous": {"algorithm": "fedbuff",
                                                                                       "buffer_size": 3}},
                             validation={"select": "last"})
    fedasync = fedbuff.model_copy(update={"federation": fedbuff.federation.model_copy(
        update={"asynchronous": AsyncConfig(algorithm="fedasync")})})
    assert update_limit(fedbuff) == async_update_limit(4, 3) > update_limit(fedasync) == async_update_limit(4, 1)
    assert update_limit(TrainingConfig(rounds=4)) is None  # sync: one update per round
