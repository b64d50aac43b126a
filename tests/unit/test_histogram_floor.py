"""Score histograms are published coarse enough that no non-empty bin places fewer rows than the floor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from protocol_examples import evaluation, store
from torch import nn

from insitu.federated.exchange import Exchange, ExchangeError
from insitu.federated.kinds import MIN_ROWS
from insitu.metrics import floor_histograms
from insitu.plots import floored, pr_curve_figure, pr_curve_from_histograms
from insitu.specs.binary import BinaryClassification

BINARY = BinaryClassification.__new__(BinaryClassification)  # the task's methods need no schema here


def _ok(hist: list[int], floor: int = MIN_ROWS) -> bool:
    return all(c == 0 or c >= floor for c in hist)


def test_a_single_row_bin_is_merged_away() -> None:
    pos = [0, 1, 0, 30, 0, 0, 25, 0]  # bin 1 holds one positive row: it would place that row's score
    neg = [40, 0, 30, 2, 50, 0, 0, 10]
    out = floor_histograms(pos, neg)
    assert out is not None
    p, n = out
    assert _ok(p) and _ok(n) and 1 not in p
    assert sum(p) == sum(pos) and sum(n) == sum(neg)  # merged, never dropped
    assert len(p) == len(pos) == len(n)  # the grid is kept: sites' histograms still add up bin by bin
    # groups (in their lowest bin): [0] (0, 40); [1-3] (31, 32) takes the single row; [4] (0, 50), and [5-7]
    # (25, 10) was short of negatives, so it was merged back into it
    assert (p, n) == ([0, 31, 0, 0, 25, 0, 0, 0], [40, 32, 0, 0, 60, 0, 0, 0])


def test_the_pr_curve_is_exact_at_the_edges_of_the_merged_groups() -> None:
    rng = np.random.default_rng(1)
    y = rng.random(3000) < 0.1
    scores = np.clip(rng.normal(0.3 + 0.4 * y, 0.15), 0, 1)
    edges = np.linspace(0, 1, 101)
    pos, neg = np.histogram(scores[y], edges)[0], np.histogram(scores[~y], edges)[0]
    assert not _ok(list(pos)) or not _ok(list(neg))  # the raw histograms do have bins under the floor
    out = floor_histograms(pos, neg)
    assert out is not None and _ok(out[0]) and _ok(out[1])
    fine, coarse = pr_curve_from_histograms(pos, neg), pr_curve_from_histograms(*out)
    # At the lower edge of every group (a non-empty bin of the coarse histograms) both curves agree.
    for first in [i for i in range(100) if out[0][i] or out[1][i]]:
        k = 100 - first - 1
        assert np.isclose(fine[0][k], coarse[0][k]) and np.isclose(fine[1][k], coarse[1][k])


@pytest.mark.parametrize(("pos", "neg"), [([5, 0, 3], [40, 30, 0]), ([0, 0, 0], [40, 0, 0]), ([19, 0], [0, 100])])
def test_no_histogram_when_a_class_is_under_the_floor(pos: list[int], neg: list[int]) -> None:
    assert floor_histograms(pos, neg) is None


def test_a_short_tail_is_merged_back() -> None:
    # (20, 0) and (0, 20) are groups; the tail (3, 0) is merged back into both: (3, 20) is still short
    assert floor_histograms([20, 0, 0, 3], [0, 20, 0, 0]) == ([23, 0, 0, 0], [20, 0, 0, 0])


def test_a_site_publishes_floored_histograms_and_the_schema_agrees(tmp_path: Path) -> None:
    from tasks.evaluate import score

    # Scores are sigmoid(x): 60 negatives near 0.1, 40 positives near 0.9, and one positive alone at 0.5.
    x = np.concatenate([np.full(60, -2.2), np.full(40, 2.2), [0.0]]).astype(np.float32)[:, None]
    x += np.linspace(0, 0.01, len(x), dtype=np.float32)[:, None]
    y = np.concatenate([np.zeros(60), np.ones(40), [1.0]]).astype(np.float32)
    model = nn.Linear(1, 1)
    with torch.no_grad():
        model.weight.fill_(1.0)
        model.bias.zero_()
    model = nn.Sequential(model, nn.Flatten(0))
    raw = np.histogram(1 / (1 + np.exp(-x[y == 1, 0])), np.linspace(0, 1, 101))[0]
    assert 1 in raw  # the raw histogram has a single-row bin
    out = score(model, BINARY, x, y, {"pos_weight": 1.0})
    assert _ok(out["hist_pos"]) and _ok(out["hist_neg"]) and 1 not in out["hist_pos"]
    assert sum(out["hist_pos"]) == 41 and sum(out["hist_neg"]) == 60
    Exchange(store(tmp_path), "j", "eu").put_json("metrics", "evaluate.json", evaluation("eu", {"round-0001": out}))


def test_a_site_under_the_floor_publishes_only_the_marker(tmp_path: Path) -> None:
    from tasks.evaluate import score

    model = nn.Sequential(nn.Linear(1, 1), nn.Flatten(0))
    x, y = np.zeros((MIN_ROWS - 1, 1), np.float32), np.array([0.0, 1.0] * 9 + [0.0], np.float32)
    assert score(model, BINARY, x, y, {"pos_weight": 1.0}) == {"withheld": f"fewer than {MIN_ROWS} rows"}
    assert score(model, BINARY, np.zeros((30, 1), np.float32), np.zeros(30, np.float32), {"pos_weight": 1.0},
                 floor=50) == {"withheld": "fewer than 50 rows"}
    marker = score(model, BINARY, x, y, {"pos_weight": 1.0})
    Exchange(store(tmp_path), "j", "eu").put_json("metrics", "evaluate.json", evaluation("eu", {"round-0001": marker}))


def test_metrics_over_too_few_rows_or_fine_histograms_are_refused_by_the_protocol(tmp_path: Path) -> None:
    ex = Exchange(store(tmp_path), "j", "eu")
    few = {"roc_auc": 0.5, "pr_auc": 0.5, "loss": 0.7, "count": 5.0, "positive_rate": 0.4}
    with pytest.raises(ExchangeError, match="models.round-0001.binary.count: Input should be greater than or equal "
                                            "to 20"):
        ex.put_json("metrics", "evaluate.json", evaluation("eu", {"round-0001": few}))
    fine = {**few, "count": 100.0, "hist_pos": [1, 0, 24], "hist_neg": [0, 75, 0]}
    with pytest.raises(ExchangeError, match="a histogram bin holds fewer than 20 rows"):
        ex.put_json("metrics", "evaluate.json", evaluation("eu", {"round-0001": fine}))


def test_the_figure_does_not_draw_a_histogram_with_a_small_bin() -> None:
    assert floored([0, 20, 25], [30, 0, 0]) and not floored([1, 20], [30, 0])
    fig = pr_curve_figure({"eu": ([1, 20, 25], [30, 0, 0]), "us": ([0, 20, 25], [30, 0, 0])})
    assert [line.get_label() for line in fig.axes[0].get_lines()] == ["us"]
