"""The running mean aggregates as every update at once would, for each mean-based aggregator; counters come
from the largest site; and the robust aggregators are not mean-based (a median of one mean is no median)."""

from __future__ import annotations

import pytest
import torch

from insitu.federated.aggregators import AGGREGATORS, Update, build_aggregator
from insitu.federated.running_mean import RunningMean


def _state(seed: int, counter: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(7, 5, generator=g), "b": torch.randn(5, generator=g),
            "n": torch.tensor(counter, dtype=torch.int64)}


GLOBAL = _state(0, 0)
UPDATES = [Update(f"s{i}", _state(i + 1, 10 + i), n) for i, n in enumerate([500, 0, 1200, 300, 1200, 7])]


@pytest.mark.parametrize("name", sorted(n for n, cls in AGGREGATORS.items() if cls.mean_based))
def test_one_running_mean_aggregates_like_every_update(name: str) -> None:
    running = RunningMean()
    for u in UPDATES:
        running.add(u.site, u.state, u.n_samples)
    for server_state in (None, "after one round"):
        agg = build_aggregator(name)
        kept_all = kept_one = None
        if server_state:  # a stateful aggregator's second round, from the state its first round kept
            kept_all = agg.aggregate(1, GLOBAL, UPDATES)[1]
            kept_one = agg.aggregate(1, GLOBAL, [running.as_update()])[1]
        all_at_once, kept_a = agg.aggregate(2, GLOBAL, UPDATES, kept_all)
        streamed, kept_b = agg.aggregate(2, GLOBAL, [running.as_update()], kept_one)
        for k in GLOBAL:
            assert torch.allclose(streamed[k], all_at_once[k], rtol=1e-5, atol=1e-6), (name, k)
        assert (kept_a is None) == (kept_b is None)


def test_counters_come_from_the_first_largest_site_and_samples_add_up() -> None:
    running = RunningMean()
    for u in UPDATES:
        running.add(u.site, u.state, u.n_samples)
    one = running.as_update()
    assert one.n_samples == sum(u.n_samples for u in UPDATES)
    assert int(one.state["n"]) == 12  # s2: 1200 samples, before s4's equal 1200
    assert one.site == "s0+s1+s2+s3+s4+s5"


def test_the_caller_s_tensors_are_never_changed() -> None:
    first = _state(1, 1)
    before = {k: v.clone() for k, v in first.items()}
    running = RunningMean()
    running.add("a", first, 10)
    running.add("b", _state(2, 2), 30)
    assert all(torch.equal(first[k], before[k]) for k in first)


def test_robust_aggregators_do_not_stream() -> None:
    assert not AGGREGATORS["median"].mean_based and not AGGREGATORS["trimmed_mean"].mean_based
    assert AGGREGATORS["fedavg"].mean_based and AGGREGATORS["fedprox"].mean_based


def test_half_precision_states_are_averaged_in_float32_and_come_back_in_their_dtype() -> None:
    running = RunningMean()
    for i in range(200):  # 200 sites whose bf16 weights differ by less than bf16 can tell apart step by step
        running.add(f"s{i}", {"w": torch.full((4,), 1.0 + (i % 2) * 2**-6, dtype=torch.bfloat16)}, 1)
    out = running.as_update().state["w"]
    assert out.dtype == torch.bfloat16
    assert float(out[0]) == pytest.approx(1.0 + 2**-7, abs=2**-8)
