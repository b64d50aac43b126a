"""Figures for MLflow, drawn from aggregates only (score histograms, per-site metrics)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def pr_curve_from_histograms(pos: Sequence[float], neg: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Precision and recall at each bin edge (threshold descending) from per-class score histograms."""
    tp = np.cumsum(np.asarray(pos, dtype=float)[::-1])
    fp = np.cumsum(np.asarray(neg, dtype=float)[::-1])
    total_pos = max(tp[-1], 1.0)
    precision = np.divide(tp, tp + fp, out=np.ones_like(tp), where=(tp + fp) > 0)
    return precision, tp / total_pos


def pr_curve_figure(curves: Mapping[str, tuple[Sequence[float], Sequence[float]]]) -> Figure:
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for label, (pos, neg) in curves.items():
        p, r = pr_curve_from_histograms(pos, neg)
        ax.plot(r, p, label=label, linewidth=2.5 if label == "global" else 1.2)
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_title("PR curve on each site's test split (from score histograms)")
    ax.legend()
    fig.tight_layout()
    return fig


def site_metrics_figure(site_metrics: Mapping[str, Mapping[str, float]], names: Sequence[str]) -> Figure:
    sites = list(site_metrics)
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.8 / max(len(names), 1)
    for i, n in enumerate(names):
        ax.bar(np.arange(len(sites)) + i * width, [site_metrics[s].get(n, np.nan) for s in sites], width, label=n)
    ax.set_xticks(np.arange(len(sites)) + width * (len(names) - 1) / 2, sites)
    ax.set_ylim(0, 1)
    ax.set_title("test metrics per site")
    ax.legend()
    fig.tight_layout()
    return fig
