"""The coordinator's round loop, as plain code: aggregate each round, follow the validation metric, stop
early when it stops improving, and select the round whose model is registered.

The Prefect layer supplies a :class:`RoundDriver` (its methods are Prefect tasks and MLflow calls); the
decisions are here, so they are unit-tested without a server. A resumed job replays the same loop: finished
rounds come back from the exchange (``aggregate`` returns them as ``resumed``), their validations are still
there, and the same history gives the same decisions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from insitu.federated.validation import RoundValidation, Selection

log = logging.getLogger(__name__)


class RoundDriver(Protocol):
    def aggregate(self, rnd: int) -> dict[str, Any]:
        """Collect round ``rnd``'s updates and publish global model ``rnd + 1`` (see ``rounds.run_round``)."""

    def validation(self, rnd: int, wait: bool) -> tuple[dict[str, float], list[str]] | None:
        """The sites' combined validation metrics of global model ``rnd`` and the sites they came from; with
        ``wait``, first wait (until the round deadline) for sites that have not published theirs yet."""

    def record(self, rnd: int, result: dict[str, Any] | None, validation: RoundValidation | None) -> None:
        """Log round ``rnd`` (``result`` None for the final model, which is only validated)."""

    def stop(self, after_round: int, reason: str) -> None:
        """Tell the sites that training ended after round ``after_round``."""


@dataclass
class RoundsOutcome:
    results: list[dict[str, Any]]  # one per aggregated round
    last: int  # the newest global model (= the number of aggregated rounds)
    selected: int  # the global model to evaluate, gate and register
    reason: str  # why that one
    stopped_early: bool
    selection: Selection


def run_rounds(driver: RoundDriver, rounds: int, selection: Selection) -> RoundsOutcome:
    """Aggregate up to ``rounds`` rounds; after each, read the validation of the global model the round
    trained from, and stop early when :meth:`Selection.should_stop` says so."""
    results: list[dict[str, Any]] = []
    stopped = False
    for rnd in range(rounds):
        result = driver.aggregate(rnd)  # publishes global model rnd + 1
        results.append(result)
        # Sites validate a global model before training from it: round rnd's validations are in by now.
        seen = driver.validation(rnd, wait=False)
        v = selection.observe(rnd, *seen) if seen else None
        driver.record(rnd, result, v)
        if selection.should_stop(rnd) and rnd + 1 < rounds:
            best = selection.best()
            reason = (f"validation {selection.metric.name} has not improved for {selection.config.patience} "
                      f"round(s) since round {best.round if best else '?'}")
            log.info("stopping after round %d: %s", rnd, reason)
            driver.stop(rnd, reason)
            stopped = True
            break
    last = len(results)
    seen = driver.validation(last, wait=True)
    v = selection.observe(last, *seen) if seen else None
    driver.record(last, None, v)
    selected, why = selection.selected(last)
    return RoundsOutcome(results, last, selected, why, stopped, selection)
