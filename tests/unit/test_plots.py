"""PR curve from score histograms equals the PR curve from the scores (at the bin edges)."""

from __future__ import annotations

import numpy as np

from insitu.plots import pr_curve_figure, pr_curve_from_histograms, site_metrics_figure


def test_pr_curve_from_histograms_matches_exact_counts() -> None:
    rng = np.random.default_rng(0)
    y = rng.random(2000) < 0.1
    p = np.clip(rng.normal(0.3 + 0.4 * y, 0.15), 0, 1)
    edges = np.linspace(0, 1, 101)
    prec, rec = pr_curve_from_histograms(np.histogram(p[y], edges)[0], np.histogram(p[~y], edges)[0])
    for k in (10, 50, 90):  # threshold = edges[100 - k - 1]: scores in the top k+1 bins
        thr = edges[100 - k - 1]
        tp, fp = ((p >= thr) & y).sum(), ((p >= thr) & ~y).sum()
        assert np.isclose(rec[k], tp / y.sum()) and np.isclose(prec[k], tp / (tp + fp))
    assert np.isclose(rec[-1], 1.0)


def test_figures_render() -> None:
    fig = pr_curve_figure({"eu": ([1, 2, 3], [5, 2, 1])})
    assert fig.axes[0].get_xlabel() == "recall"
    fig2 = site_metrics_figure({"eu": {"pr_auc": 0.4, "roc_auc": 0.8}}, ["roc_auc", "pr_auc"])
    assert len(fig2.axes[0].patches) == 2


def test_sites_without_a_histogram_are_named_on_the_pr_curve() -> None:
    fig = pr_curve_figure({}, withheld=["eu", "us"])
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("eu, us" in t and "fewer than 20" in t for t in texts), texts
