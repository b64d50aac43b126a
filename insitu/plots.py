"""Figures for MLflow, drawn from aggregates only (score histograms, per-site metrics)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from insitu.federated.kinds import MIN_ROWS  # noqa: E402

log = logging.getLogger(__name__)


def floored(pos: Sequence[float], neg: Sequence[float], floor: int = MIN_ROWS) -> bool:
    """Whether every non-empty bin of both histograms holds at least ``floor`` rows (what sites publish)."""
    return all(c == 0 or c >= floor for c in (*pos, *neg))


def pr_curve_from_histograms(pos: Sequence[float], neg: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Precision and recall at each bin edge (threshold descending) from per-class score histograms."""
    tp = np.cumsum(np.asarray(pos, dtype=float)[::-1])
    fp = np.cumsum(np.asarray(neg, dtype=float)[::-1])
    total_pos = max(tp[-1], 1.0)
    precision = np.divide(tp, tp + fp, out=np.ones_like(tp), where=(tp + fp) > 0)
    return precision, tp / total_pos


def pr_curve_figure(curves: Mapping[str, tuple[Sequence[float], Sequence[float]]], floor: int = MIN_ROWS,
                    withheld: Sequence[str] = ()) -> Figure:
    """PR curves from per-class score histograms. A curve whose histograms have a bin under ``floor`` rows is
    not drawn: a published figure would place those few rows' scores. Sites that published no histogram
    (``withheld``: too few rows of a class) are named on the figure, so that a missing curve is explained."""
    fig, ax = plt.subplots(figsize=(6, 4.5))
    if withheld:
        ax.text(0.02, 0.02, f"not drawn (fewer than {floor} test rows of a class): {', '.join(withheld)}",
                transform=ax.transAxes, fontsize=8, color="dimgray")
    for label, (pos, neg) in curves.items():
        if not floored(pos, neg, floor):
            log.warning("PR curve of %s not drawn: a histogram bin holds fewer than %d rows", label, floor)
            continue
        p, r = pr_curve_from_histograms(pos, neg)
        ax.plot(r, p, label=label, linewidth=2.5 if label == "global" else 1.2)
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_title("PR curve on each site's test split (from score histograms)")
    if ax.get_legend_handles_labels()[0]:
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
    values = [site_metrics[s].get(n, np.nan) for s in sites for n in names]
    if all(0.0 <= v <= 1.0 for v in values if not np.isnan(v)):  # scores in [0, 1]; an RMSE has its own scale
        ax.set_ylim(0, 1)
    ax.set_title("test metrics per site")
    ax.legend()
    fig.tight_layout()
    return fig


def confusion_figure(confusion: np.ndarray, classes: Sequence[str] | None = None) -> Figure:
    """The global confusion matrix (the sum of the sites' counts), rows normalised to recall per class."""
    c = np.asarray(confusion, dtype=float)
    rows = c.sum(axis=1, keepdims=True)
    share = np.divide(c, rows, out=np.zeros_like(c), where=rows > 0)
    labels = list(classes) if classes else [str(i) for i in range(len(c))]
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    im = ax.imshow(share, vmin=0, vmax=1, cmap="Blues")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title("confusion matrix on the sites' test splits (share of each true class)")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    return fig
