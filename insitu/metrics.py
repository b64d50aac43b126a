"""Binary classification metrics, their row floor, and their sample-weighted combination across sites."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from insitu.federated.kinds import MIN_ROWS

log = logging.getLogger(__name__)


def binary_metrics(y: np.ndarray, scores: np.ndarray, loss: float) -> dict[str, float]:
    """ROC-AUC, PR-AUC (average precision), loss and count. AUCs are NaN when one class is absent."""
    # Imported here, not at the top: every configuration load imports the task specs (and so this module), and
    # scikit-learn's import alone took 1.5 s of each CLI command.
    from sklearn.metrics import average_precision_score, roc_auc_score

    y = np.asarray(y).astype(int)
    both = 0 < y.sum() < len(y)
    return {
        "roc_auc": float(roc_auc_score(y, scores)) if both else float("nan"),
        "pr_auc": float(average_precision_score(y, scores)) if both else float("nan"),
        "loss": float(loss),
        "count": float(len(y)),
        "positive_rate": float(y.mean()) if len(y) else float("nan"),
    }


def withheld(floor: int = MIN_ROWS) -> dict[str, str]:
    """What a site publishes instead of a model's metrics when its split has fewer rows than ``floor``."""
    return {"withheld": f"fewer than {floor} rows"}


def floor_histograms(
    pos: Sequence[int], neg: Sequence[int], floor: int = MIN_ROWS
) -> tuple[list[int], list[int]] | None:
    """Coarsen per-class score histograms (same bins) until no non-empty bin holds fewer than ``floor`` rows.

    Adjacent bins are merged left to right into groups in which each class has either no row or at least
    ``floor``; a short tail is merged back into the groups before it. A group's counts go to its lowest bin and
    its other bins stay empty: the histograms keep their grid, so sites' histograms still add up bin by bin, and
    a PR curve drawn from them is exact at every group's edges. None (publish no histogram) when a class has
    fewer than ``floor`` rows in all: no coarsening hides those.
    """
    p, n = [int(c) for c in pos], [int(c) for c in neg]
    if len(p) != len(n):
        raise ValueError(f"histograms of {len(p)} and {len(n)} bins")
    if sum(p) < floor or sum(n) < floor:
        return None

    def ok(a: int, b: int) -> bool:
        return (a == 0 or a >= floor) and (b == 0 or b >= floor)

    groups: list[list[int]] = []  # [first bin, positives, negatives]
    current: list[int] | None = None
    for i, (a, b) in enumerate(zip(p, n, strict=True)):
        current = current or [i, 0, 0]
        current[1] += a
        current[2] += b
        if (current[1] or current[2]) and ok(current[1], current[2]):
            groups.append(current)
            current = None
    if current is not None and (current[1] or current[2]):
        groups.append(current)
    while len(groups) > 1 and not ok(groups[-1][1], groups[-1][2]):  # ends valid: the totals are >= floor
        last = groups.pop()
        groups[-1][1] += last[1]
        groups[-1][2] += last[2]
    out_p, out_n = [0] * len(p), [0] * len(n)
    for first, a, b in groups:
        out_p[first], out_n[first] = a, b
    return out_p, out_n


def withheld_sites(per_site: Mapping[str, Mapping[str, Any]], min_rows: int = MIN_ROWS) -> list[str]:
    """Sites whose metrics are withheld (a marker, or no count of at least ``min_rows``)."""
    return [s for s, m in per_site.items() if "withheld" in m or not float(m.get("count", 0.0)) >= min_rows]


def weighted_global(per_site: Mapping[str, Mapping[str, Any]], min_rows: int = MIN_ROWS) -> dict[str, float]:
    """Sample-weighted mean of each metric over the sites (NaN values are left out of that metric).

    Sites that withheld their metrics (fewer test rows than the floor) are left out of every metric, loss
    and positive rate included, and named in the log.
    """
    skipped = withheld_sites(per_site, min_rows)
    if skipped:
        log.warning("global metrics leave out %s: metrics withheld (fewer than %d test rows)", skipped, min_rows)
    used = [m for s, m in per_site.items() if s not in skipped]
    out: dict[str, float] = {}
    names = {k for m in used for k in m if k != "count"}
    for name in sorted(names):
        pairs = [(float(m[name]), float(m["count"])) for m in used if name in m and not np.isnan(m[name])]
        total = sum(c for _, c in pairs)
        out[name] = float(sum(v * c for v, c in pairs) / total) if total else float("nan")
    out["count"] = float(sum(float(m["count"]) for m in used))
    return out
