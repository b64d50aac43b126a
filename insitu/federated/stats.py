"""Federated feature statistics: sites share counts, sums and sums of squares, never values.

Combining partial statistics gives exactly the mean and standard deviation of the pooled data,
so the coordinator can normalise features globally without seeing any site's rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np


def partial_stats(x: np.ndarray, y: np.ndarray | None = None, classes: int | None = 2) -> dict[str, Any]:
    """Aggregate statistics of a feature matrix ``x`` (rows × features) and its labels ``y``.

    With ``classes`` (labels are class indices ``0 … classes-1``; 2 for a binary label) the label's part is
    its count per class (``label_counts``); with ``classes=None`` (a numeric label) its sum and sum of squares.
    """
    x64 = np.asarray(x, dtype=np.float64)
    out: dict[str, Any] = {
        "n": int(x64.shape[0]),
        "sum": x64.sum(axis=0).tolist(),
        "sumsq": (x64 * x64).sum(axis=0).tolist(),
    }
    if y is not None:
        y64 = np.asarray(y, dtype=np.float64)
        if classes is not None:
            out["label_counts"] = np.bincount(y64.astype(np.int64), minlength=classes)[:classes].tolist()
        else:
            out["label_sum"], out["label_sumsq"] = float(y64.sum()), float((y64 * y64).sum())
    return out


def combine(parts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Sum partial statistics from several shards or sites."""
    parts = [p for p in parts if p and p.get("n", 0) > 0]
    if not parts:
        return {"n": 0, "sum": [], "sumsq": []}
    width = len(parts[0]["sum"])
    if any(len(p["sum"]) != width for p in parts):
        raise ValueError("partial statistics have different feature widths")
    out: dict[str, Any] = {
        "n": sum(int(p["n"]) for p in parts),
        "sum": np.sum([p["sum"] for p in parts], axis=0).tolist(),
        "sumsq": np.sum([p["sumsq"] for p in parts], axis=0).tolist(),
    }
    if all("label_counts" in p for p in parts):
        if len({len(p["label_counts"]) for p in parts}) != 1:
            raise ValueError("partial statistics count different numbers of classes")
        out["label_counts"] = np.sum([p["label_counts"] for p in parts], axis=0).astype(int).tolist()
    elif all("label_sum" in p for p in parts):
        out["label_sum"] = float(sum(float(p["label_sum"]) for p in parts))
        out["label_sumsq"] = float(sum(float(p["label_sumsq"]) for p in parts))
    elif any("label_counts" in p or "label_sum" in p for p in parts):
        raise ValueError("partial statistics describe their labels differently (class counts and sums mixed)")
    return out


def mean_std(stats: dict[str, Any], eps: float = 1e-6) -> tuple[list[float], list[float]]:
    """Population mean and standard deviation from combined statistics (std floored at ``eps``)."""
    n = stats["n"]
    if n <= 0:
        raise ValueError("no samples: cannot compute mean and std")
    mean = [s / n for s in stats["sum"]]
    std = [math.sqrt(max(q / n - m * m, 0.0)) for q, m in zip(stats["sumsq"], mean, strict=True)]
    return mean, [max(s, eps) for s in std]
