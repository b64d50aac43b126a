"""Binary classification metrics, and their sample-weighted combination across sites."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from sklearn.metrics import average_precision_score, roc_auc_score


def binary_metrics(y: np.ndarray, scores: np.ndarray, loss: float) -> dict[str, float]:
    """ROC-AUC, PR-AUC (average precision), loss and count. AUCs are NaN when one class is absent."""
    y = np.asarray(y).astype(int)
    both = 0 < y.sum() < len(y)
    return {
        "roc_auc": float(roc_auc_score(y, scores)) if both else float("nan"),
        "pr_auc": float(average_precision_score(y, scores)) if both else float("nan"),
        "loss": float(loss),
        "count": float(len(y)),
        "positive_rate": float(y.mean()) if len(y) else float("nan"),
    }


def weighted_global(per_site: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Sample-weighted mean of each metric over the sites (NaN values are left out of that metric)."""
    out: dict[str, float] = {}
    names = {k for m in per_site.values() for k in m if k != "count"}
    for name in sorted(names):
        pairs = [(m[name], m["count"]) for m in per_site.values() if name in m and not np.isnan(m[name])]
        total = sum(c for _, c in pairs)
        out[name] = float(sum(v * c for v, c in pairs) / total) if total else float("nan")
    out["count"] = float(sum(m.get("count", 0.0) for m in per_site.values()))
    return out
