"""Per-round federated validation on the coordinator's side: which round is best, and when to stop.

Every round each site scores the global model it received on its own validation split and publishes the
metrics (``metrics/validation-round-N.json``, aggregates over at least the row floor). The coordinator
combines the sites' metrics with the task's exact combination into one value per global model, keeps the
history, stops early when the metric has not improved for ``patience`` rounds, and selects the round whose
model is registered: the best by the validation metric (or the last, if configured so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from insitu.conf import ValidationConfig
from insitu.specs.base import GateMetric


@dataclass
class RoundValidation:
    """One global model's validation: the combined metrics and the sites they came from."""

    round: int
    value: float
    metrics: dict[str, float]
    sites: list[str]


@dataclass
class Selection:
    """Tracks the validation history of a job's global models; pure, so that a resumed job, fed the same
    history from the exchange, decides the same."""

    metric: GateMetric
    config: ValidationConfig
    history: list[RoundValidation] = field(default_factory=list)
    # Sites whose numbers were refused or disagreed with the others' (insitu.federated.consensus), and why.
    suspects: dict[str, list[str]] = field(default_factory=dict)

    def suspect(self, site: str, why: str, keep: int = 8) -> None:
        """Name ``site`` with ``why`` (its first ``keep`` distinct reasons are kept for the summary)."""
        reasons = self.suspects.setdefault(site, [])
        if why not in reasons and len(reasons) < keep:
            reasons.append(why)

    def observe(self, rnd: int, metrics: dict[str, float], sites: list[str]) -> RoundValidation:
        value = float(metrics.get(self.metric.name, math.nan))
        v = RoundValidation(rnd, value, metrics, sites)
        self.history = [h for h in self.history if h.round != rnd] + [v]
        self.history.sort(key=lambda h: h.round)
        return v

    def best(self) -> RoundValidation | None:
        """The validated round with the best value; the earlier one of equals (fewer rounds, same quality).

        A round is "better" only by more than ``min_delta``: noise in the metric does not move the choice.
        """
        best: RoundValidation | None = None
        for h in self.history:
            if math.isnan(h.value):
                continue
            if best is None or self.metric.improvement(h.value, best.value) > self.config.min_delta:
                best = h
        return best

    def should_stop(self, rnd: int) -> bool:
        """After round ``rnd``'s model was validated: has the metric not improved for ``patience`` rounds?"""
        best = self.best()
        return bool(self.config.patience) and best is not None and rnd - best.round >= self.config.patience

    def selected(self, last: int) -> tuple[int, str]:
        """The round to register (``last`` is the newest global model) and why."""
        best = self.best()
        if self.config.select == "last":
            return last, "the last round (validation.select: last)"
        if best is None:
            return last, f"the last round: no round has a validation {self.metric.name}"
        return best.round, f"the best round by validation {self.metric.name} ({best.value:.4f} at round {best.round})"

    def as_dict(self) -> dict[str, Any]:
        return {"metric": self.metric.name, "history": [
            {"round": h.round, "value": h.value, "sites": h.sites} for h in self.history]}
