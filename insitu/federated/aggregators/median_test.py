"""Coordinate-wise median: hand-computed values, even counts, unweighted, and one wild update ignored."""

from __future__ import annotations

import torch

from insitu.federated.aggregators import FedAvg, Median, Update


def _ups(values: list[list[float]], samples: list[int] | None = None) -> list[Update]:
    samples = samples or [1] * len(values)
    return [Update(f"s{i}", {"w": torch.tensor(v)}, n) for i, (v, n) in enumerate(zip(values, samples, strict=True))]


G = {"w": torch.tensor([0.0, 0.0])}


def test_per_coordinate_median_odd() -> None:
    # Coordinate 0: {1, 2, 3} -> 2 (site s1's value); coordinate 1: {7, 9, 8} -> 8 (site s2's value).
    out, state = Median().aggregate(1, G, _ups([[1.0, 7.0], [2.0, 9.0], [3.0, 8.0]]), None)
    assert torch.equal(out["w"], torch.tensor([2.0, 8.0]))
    assert state is None


def test_even_count_averages_the_two_middle_values() -> None:
    # {1, 2, 3, 10} -> (2 + 3) / 2 = 2.5; torch.median would give 2.
    out, _ = Median().aggregate(1, G, _ups([[1.0, 0.0], [10.0, 0.0], [2.0, 1.0], [3.0, 1.0]]), None)
    assert torch.equal(out["w"], torch.tensor([2.5, 0.5]))


def test_unweighted() -> None:
    # The 1000-sample site at 100 would dominate a weighted mean; the median is still the middle value.
    out, _ = Median().aggregate(1, G, _ups([[0.0, 0.0], [100.0, 100.0], [1.0, 1.0]], [1, 1000, 1]), None)
    assert torch.equal(out["w"], torch.tensor([1.0, 1.0]))


def test_one_wild_update_is_ignored_where_fedavg_is_not() -> None:
    honest = [[1.0, -1.0], [2.0, -2.0], [3.0, -3.0], [4.0, -4.0]]
    wild = [1e6, 1e6]
    med, _ = Median().aggregate(1, G, _ups([*honest, wild]), None)
    assert torch.equal(med["w"], torch.tensor([3.0, -2.0]))  # {1,2,3,4,1e6} -> 3; {-4,-3,-2,-1,1e6} -> -2
    avg, _ = FedAvg().aggregate(1, G, _ups([*honest, wild]), None)
    assert float(avg["w"][0]) > 1e5


def test_float64_kept_exact() -> None:
    g = {"w": torch.tensor([0.0], dtype=torch.float64)}
    ups = [Update(s, {"w": torch.tensor([v], dtype=torch.float64)}, 1) for s, v in [("a", 0.1), ("b", 0.2)]]
    out, _ = Median().aggregate(1, g, ups, None)
    assert out["w"].dtype == torch.float64 and out["w"].item() == (0.1 + 0.2) / 2
