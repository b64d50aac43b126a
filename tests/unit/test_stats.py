"""Federated feature statistics: combining shard partials gives the pooled mean and std exactly."""

from __future__ import annotations

import numpy as np
import pytest

from insitu.federated.stats import combine, mean_std, partial_stats


def test_combined_shards_equal_pooled_mean_and_std() -> None:
    rng = np.random.default_rng(42)
    shards = [rng.normal(loc=[0.0, 10.0, -3.0], scale=[1.0, 5.0, 0.1], size=(n, 3)) for n in (17, 250, 3, 90)]
    labels = [rng.random(len(x)) < 0.3 for x in shards]
    combined = combine(partial_stats(x, y) for x, y in zip(shards, labels, strict=True))

    pooled = np.concatenate(shards)
    assert combined["n"] == len(pooled) == 360
    mean, std = mean_std(combined)
    assert np.allclose(mean, pooled.mean(axis=0))
    assert np.allclose(std, pooled.std(axis=0))  # population std (ddof=0)
    # a single shard's statistics are not the pooled ones (the test would catch "use the first part")
    assert not np.allclose(mean_std(partial_stats(shards[0]))[0], pooled.mean(axis=0))


def test_class_counts_add_up() -> None:
    x = np.ones((4, 2))
    parts = [partial_stats(x, np.array([1, 0, 1, 1])), partial_stats(x, np.array([0, 0, 0, 1]))]
    assert [p["label_counts"] for p in parts] == [[1, 3], [3, 1]]
    assert combine(parts)["label_counts"] == [4, 4]
    assert combine(parts)["n"] == 8
    three = [partial_stats(x, np.array([0, 2, 2, 1]), classes=3), partial_stats(x, np.array([2, 2, 2, 2]), classes=3)]
    assert combine(three)["label_counts"] == [1, 1, 6]


def test_a_numeric_label_adds_its_sum_and_sum_of_squares() -> None:
    x = np.ones((3, 1))
    parts = [partial_stats(x, np.array([1.0, 2.0, 3.0]), classes=None), partial_stats(x, np.array([-1.0, 0, 0]),
                                                                                        classes=None)]
    out = combine(parts)
    assert out["label_sum"] == 5.0 and out["label_sumsq"] == 15.0 and "label_counts" not in out


def test_labels_described_two_ways_do_not_mix() -> None:
    x = np.ones((2, 1))
    with pytest.raises(ValueError, match="describe their labels differently"):
        combine([partial_stats(x, np.array([0, 1])), partial_stats(x, np.array([0.5, 1.5]), classes=None)])


def test_partial_stats_values() -> None:
    p = partial_stats(np.array([[1.0, 2.0], [3.0, -4.0]]), np.array([True, False]))
    assert p == {"n": 2, "sum": [4.0, -2.0], "sumsq": [10.0, 20.0], "label_counts": [1, 1]}


def test_empty_parts_are_ignored() -> None:
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    full = partial_stats(x, np.array([0, 1]))
    # an empty shard (even one whose width differs), an empty dict and None are skipped, not summed
    empty_other_width = partial_stats(np.zeros((0, 5)), np.zeros(0))
    out = combine([{}, full, empty_other_width, None])
    assert out == {"n": 2, "sum": [4.0, 6.0], "sumsq": [10.0, 20.0], "label_counts": [1, 1]}


def test_nothing_to_combine() -> None:
    out = combine([{}, partial_stats(np.zeros((0, 3)))])
    assert out == {"n": 0, "sum": [], "sumsq": []}
    with pytest.raises(ValueError, match="no samples"):
        mean_std(out)


def test_width_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="different feature widths"):
        combine([partial_stats(np.ones((2, 3))), partial_stats(np.ones((2, 4)))])


def test_constant_feature_std_is_floored() -> None:
    mean, std = mean_std(partial_stats(np.array([[5.0, 1.0], [5.0, 3.0]])), eps=1e-3)
    assert mean == [5.0, 2.0]
    assert std == [1e-3, 1.0]
