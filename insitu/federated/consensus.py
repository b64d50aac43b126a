"""Combining the sites' metrics where they decide something, so that one site cannot decide alone.

The task's own combination (``pooled``: sample-weighted, or exact from sums) is what a metric over every row
would be; it is also what one site moves at will by reporting a high value over many rows. ``median`` and
``trimmed_mean`` take each metric across the sites instead, unweighted: with three or more sites one site's
number alone cannot pull them past the honest ones'. Which is used (``validation.combine``) decides the best
round, early stopping and the gate; a site whose metric differs from the sites' median by more than
``validation.max_disagreement`` is named (the summary, the log).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from insitu.conf import ValidationConfig
from insitu.federated.claims import ClaimRefusal, screen_metrics
from insitu.metrics import withheld_sites


class Combines(Protocol):
    def global_metrics(self, per_site: Mapping[str, Mapping[str, Any]]) -> dict[str, float]: ...


def combination(config: ValidationConfig, n_sites: int) -> str:
    """The combination in force: the configured one, or for ``auto`` median with 3 or more sites, else pooled."""
    if config.combine != "auto":
        return config.combine
    return "median" if n_sites >= 3 else "pooled"


def trimmed_mean(values: list[float], trim: float) -> float:
    """The mean after dropping ``floor(trim * n)`` values at each end (``trim < 0.5`` always keeps one)."""
    s = sorted(values)
    k = math.floor(trim * len(s) + 1e-9)
    kept = s[k:len(s) - k]
    return float(sum(kept) / len(kept))


def across_sites(per_site: Mapping[str, Mapping[str, Any]], how: str, trim: float = 0.34) -> dict[str, float]:
    """Each numeric metric taken across the sites by ``how`` (``median`` or ``trimmed_mean``), NaN values left
    out; ``count`` stays the total rows the metrics came from. Sites that withheld theirs are left out."""
    used = [m for s, m in per_site.items() if s not in withheld_sites(per_site)]
    names = sorted({k for m in used for k, v in m.items()
                    if k != "count" and isinstance(v, int | float) and not isinstance(v, bool)})
    out: dict[str, float] = {}
    for name in names:
        values = [float(m[name]) for m in used if isinstance(m.get(name), int | float) and not math.isnan(m[name])]
        if not values:
            out[name] = math.nan
        elif how == "median":
            out[name] = float(statistics.median(values))
        elif how == "trimmed_mean":
            out[name] = trimmed_mean(values, trim)
        else:
            raise ValueError(f"unknown combination {how!r}: pooled, median or trimmed_mean")
    out["count"] = float(sum(float(m.get("count", 0.0)) for m in used))
    return out


def combine(task: Combines, per_site: Mapping[str, Mapping[str, Any]], how: str,
            trim: float = 0.34) -> dict[str, float]:
    """The sites' metrics combined by ``how``: ``pooled`` is the task's own exact combination."""
    if how == "pooled":
        return task.global_metrics(per_site)
    return across_sites(per_site, how, trim)


def disagreeing(values: Mapping[str, float], bound: float) -> dict[str, float]:
    """Sites whose value differs from the median of all the sites' by more than ``bound`` (and by how much).

    Needs at least three sites with a value: with two, neither can tell which one is off. (The median of the
    *other* sites would not do: with three sites it is the mean of the other two, which a liar moves.)
    """
    finite = {s: v for s, v in values.items() if not math.isnan(v)}
    if len(finite) < 3:
        return {}
    middle = float(statistics.median(finite.values()))
    return {s: v - middle for s, v in finite.items() if abs(v - middle) > bound}


@dataclass
class Judged:
    """One decision's metrics: what was combined, from which sites, what was refused and who disagreed."""

    metrics: dict[str, float]
    sites: list[str]  # the sites whose metrics were combined
    how: str
    refused: list[ClaimRefusal] = field(default_factory=list)
    disagreeing: dict[str, float] = field(default_factory=dict)  # site -> its metric minus the others' median


def judge(task: Combines, per_site: Mapping[str, Mapping[str, Any]], committed: Mapping[str, Mapping[str, int]],
          split: str, what: str, metric: str, config: ValidationConfig) -> Judged:
    """Screen the sites' metrics (:func:`insitu.federated.claims.screen_metrics`: ranges, rows ≤ the committed
    ``split``), combine the rest by the configured combination, and name the sites whose ``metric`` disagrees."""
    kept, refused = screen_metrics(per_site, committed, split, what)
    published = {s: m for s, m in kept.items() if s not in withheld_sites(kept)}
    how = combination(config, len(published))
    metrics = combine(task, kept, how, config.trim) if published else {}
    values = {s: float(m[metric]) for s, m in published.items() if isinstance(m.get(metric), int | float)}
    return Judged(metrics, list(published), how, refused, disagreeing(values, config.max_disagreement))
