"""The coordinator's round loop and its validation decisions, without a server (a fake driver)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from insitu.conf import ValidationConfig
from insitu.federated.coordinator import run_rounds
from insitu.federated.validation import RoundValidation, Selection
from insitu.specs.base import GateMetric

PR_AUC = GateMetric("pr_auc", True, 0.05)
RMSE = GateMetric("rmse", False, None)


class FakeRounds:
    """Global model r validates at ``values[r]``; records what the loop asked for."""

    def __init__(self, values: list[float | None]) -> None:
        self.values = values
        self.aggregated: list[int] = []
        self.recorded: list[tuple[int, bool, float | None]] = []
        self.stopped: tuple[int, str] | None = None
        self.waited: list[int] = []

    def aggregate(self, rnd: int) -> dict[str, Any]:
        self.aggregated.append(rnd)
        return {"round": rnd, "sha256": f"{rnd:064x}"}

    def validation(self, rnd: int, wait: bool) -> tuple[dict[str, float], list[str]] | None:
        if wait:
            self.waited.append(rnd)
        v = self.values[rnd] if rnd < len(self.values) else None
        return None if v is None else ({"pr_auc": v, "rmse": v}, ["eu", "us"])

    def record(self, rnd: int, result: dict[str, Any] | None, validation: RoundValidation | None) -> None:
        self.recorded.append((rnd, result is not None, validation.value if validation else None))

    def stop(self, after_round: int, reason: str) -> None:
        self.stopped = (after_round, reason)


def test_all_rounds_run_and_the_best_round_is_selected() -> None:
    d = FakeRounds([0.1, 0.3, 0.5, 0.4, 0.45])
    out = run_rounds(d, 4, Selection(PR_AUC, ValidationConfig()))
    assert d.aggregated == [0, 1, 2, 3] and d.waited == [4] and d.stopped is None
    assert (out.last, out.selected, out.stopped_early) == (4, 2, False)
    assert "best round by validation pr_auc (0.5000 at round 2)" in out.reason
    # each round's result is recorded with the validation of the model it trained from; the last model only
    # with its validation
    assert d.recorded == [(0, True, 0.1), (1, True, 0.3), (2, True, 0.5), (3, True, 0.4), (4, False, 0.45)]


def test_early_stopping_after_patience_rounds_without_improvement() -> None:
    d = FakeRounds([0.1, 0.5, 0.49, 0.48, 0.3, 0.7])
    out = run_rounds(d, 5, Selection(PR_AUC, ValidationConfig(patience=2)))
    # round 3 validates model 3 (0.48): two rounds since the best (model 1): stop after round 3
    assert d.aggregated == [0, 1, 2, 3] and d.stopped is not None and d.stopped[0] == 3
    assert "not improved for 2 round(s) since round 1" in d.stopped[1]
    # model 4 came out of round 3 and is still validated (0.3), model 5 never exists
    assert out.stopped_early and out.last == 4 and out.selected == 1 and d.waited == [4]


def test_min_delta_ignores_tiny_improvements_and_lower_is_better() -> None:
    d = FakeRounds([3.0, 2.0, 1.99, 1.98, 1.97, 1.0])
    out = run_rounds(d, 5, Selection(RMSE, ValidationConfig(patience=2, min_delta=0.05)))
    assert d.stopped is not None and d.stopped[0] == 3 and out.selected == 1


def test_no_validation_means_the_last_round_and_last_can_be_chosen() -> None:
    out = run_rounds(FakeRounds([None] * 4), 3, Selection(PR_AUC, ValidationConfig(patience=1)))
    assert (out.selected, out.stopped_early) == (3, False) and "no round has a validation" in out.reason
    out = run_rounds(FakeRounds([0.9, 0.1, 0.1, 0.1]), 3, Selection(PR_AUC, ValidationConfig(select="last")))
    assert out.selected == 3


def test_a_resumed_job_decides_the_same() -> None:
    values = [0.2, 0.4, 0.3, 0.35, 0.1]
    first = run_rounds(FakeRounds(values), 4, Selection(PR_AUC, ValidationConfig(patience=2)))
    again = run_rounds(FakeRounds(values), 4, Selection(PR_AUC, ValidationConfig(patience=2)))
    assert (first.selected, first.last, first.stopped_early) == (again.selected, again.last, again.stopped_early)


def test_selection_ties_go_to_the_earlier_round_and_nan_is_skipped() -> None:
    s = Selection(PR_AUC, ValidationConfig())
    s.observe(0, {"pr_auc": math.nan}, ["eu"])
    s.observe(1, {"pr_auc": 0.5}, ["eu"])
    s.observe(2, {"pr_auc": 0.5}, ["eu"])
    best = s.best()
    assert best is not None and best.round == 1
    s.observe(1, {"pr_auc": 0.1}, ["eu"])  # observed again (a resumed job): replaced, not duplicated
    assert [h.round for h in s.history] == [0, 1, 2] and s.best().round == 2  # type: ignore[union-attr]


def test_an_aggregation_error_propagates() -> None:
    class Failing(FakeRounds):
        def aggregate(self, rnd: int) -> dict[str, Any]:
            raise RuntimeError("quorum not met")

    with pytest.raises(RuntimeError, match="quorum"):
        run_rounds(Failing([0.1]), 2, Selection(PR_AUC, ValidationConfig()))
