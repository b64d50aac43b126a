"""Coordinate-wise trimmed mean: how many are trimmed, hand-computed values, and one wild update ignored."""

from __future__ import annotations

import pytest
import torch

from insitu.federated.aggregators import FedAvg, TrimmedMean, Update, build_aggregator

G = {"w": torch.tensor([0.0, 0.0])}


def _ups(values: list[list[float]], samples: list[int] | None = None) -> list[Update]:
    samples = samples or [1] * len(values)
    return [Update(f"s{i}", {"w": torch.tensor(v)}, n) for i, (v, n) in enumerate(zip(values, samples, strict=True))]


@pytest.mark.parametrize(("beta", "n", "trimmed"), [
    (0.1, 3, 0), (0.1, 9, 0), (0.1, 10, 1), (0.2, 5, 1), (0.25, 4, 1), (0.49, 3, 1), (0.4, 5, 2), (0.0, 7, 0),
    (0.29, 100, 29),  # 0.29 * 100 is 28.999999999999996 in floating point
])
def test_number_trimmed_is_floor_beta_n(beta: float, n: int, trimmed: int) -> None:
    agg = TrimmedMean(TrimmedMean.Options(beta=beta))
    assert agg.trimmed(n) == trimmed
    assert n - 2 * agg.trimmed(n) >= 1


def test_default_beta() -> None:
    assert TrimmedMean().options.beta == 0.1


def test_hand_computed_per_coordinate() -> None:
    # beta 0.2, n 5: drop 1 at each end. Coordinate 0 {1,2,3,4,10} -> (2+3+4)/3 = 3;
    # coordinate 1 {5,-5,0,1,2} -> sorted {-5,0,1,2,5} -> (0+1+2)/3 = 1.
    ups = _ups([[1.0, 5.0], [2.0, -5.0], [3.0, 0.0], [4.0, 1.0], [10.0, 2.0]])
    out, state = build_aggregator("trimmed_mean", {"beta": 0.2}).aggregate(1, G, ups, None)
    assert torch.allclose(out["w"], torch.tensor([3.0, 1.0]))
    assert state is None


def test_nothing_trimmed_is_the_unweighted_mean() -> None:
    # beta 0.1 with 3 sites trims 0: the plain mean (1 + 2 + 6) / 3 = 3, whatever the sample counts.
    out, _ = TrimmedMean().aggregate(1, G, _ups([[1.0, 0.0], [2.0, 0.0], [6.0, 3.0]], [1, 1, 100]), None)
    assert torch.allclose(out["w"], torch.tensor([3.0, 1.0]))


def test_one_wild_update_is_ignored_where_fedavg_is_not() -> None:
    honest = [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0]]
    for wild in ([1e6, -1e6], [-1e6, 1e6]):  # at either end of the sorted values
        out, _ = build_aggregator("trimmed_mean", {"beta": 0.2}).aggregate(1, G, _ups([*honest, wild]), None)
        # {1,2,3,4,±1e6}: the wild value and one honest value at the other end are dropped.
        expected = [(2 + 3 + 4) / 3, (1 + 2 + 3) / 3] if wild[0] > 0 else [(1 + 2 + 3) / 3, (2 + 3 + 4) / 3]
        assert torch.allclose(out["w"], torch.tensor(expected))
    avg, _ = FedAvg().aggregate(1, G, _ups([*honest, [1e6, -1e6]]), None)
    assert float(avg["w"][0]) > 1e5
