"""A site's side of the synchronous round protocol, as plain code: wait for each global model, validate it
while training from it, until the last round, an early stop or an abort.

The counterpart of the coordinator's :func:`insitu.federated.coordinator.run_rounds`. The Prefect layer passes
in what a round does on this site (its tasks: train and publish an update, score a global model on the
validation split) and its run logger; the order of the protocol and its resume rules are here, so they are
unit-tested with an exchange on an in-memory store. A resumed site run replays the same loop: an update or a
validation this site already published is not made again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from insitu.federated.exchange import Exchange
from insitu.federated.kinds import COORDINATOR, ExchangeError
from insitu.federated.paths import ABORT, STOP, dispatch, global_weights, update, validation
from insitu.federated.polling import backoff

log = logging.getLogger(__name__)

Logger = logging.Logger | logging.LoggerAdapter

# How much longer than the coordinator's round deadline a site waits for a round's weights: the coordinator
# gives up on a round first (and then tells the sites with the abort marker), so a site never gives up on a
# round the coordinator still completes.
SITE_WAIT_MARGIN_S = 300.0


class Pending(Protocol):
    """A validation under way (a ``concurrent.futures.Future``, a Prefect future): ``result()`` waits for it and
    raises what it raised."""

    def result(self) -> object: ...


class ValidationFailed(RuntimeError):
    """A round's validation failed (after its own retries): the site publishes no update without it, and training
    the round again would not mend it."""


def validated_first(pending: Pending | None, site: str, rnd: int) -> Callable[[], None]:
    """What a round's training calls before it publishes its update: wait for the round's validation (None: done
    already, or none to make), so that a validation is on the exchange before its update. Calling it again after
    it returned costs nothing."""

    def wait() -> None:
        if pending is None:
            return
        try:
            pending.result()
        except Exception as e:
            raise ValidationFailed(f"site {site}: the validation of global model {rnd} failed: {e}") from e

    return wait


def start_validation(exchange: Exchange, validate: Callable[[int], Pending | None] | None,
                     number: int) -> Callable[[], None]:
    """Start validating global model ``number`` unless there is nothing to do (no validation rows, or published by
    an earlier run of the job); returns what waits for it (:func:`validated_first`)."""
    pending = validate(number) if validate is not None and not exchange.exists(validation(number)) else None
    return validated_first(pending, exchange.writer, number)


def site_wait_timeout_s(round_deadline_s: float) -> float:
    """How long a site waits for the next global model: twice the coordinator's round deadline, plus a margin."""
    return 2 * round_deadline_s + SITE_WAIT_MARGIN_S


def run_site_rounds(
    exchange: Exchange,
    rounds: int,
    *,
    train: Callable[[int, Callable[[], None]], object],
    validate: Callable[[int], Pending | None] | None,
    wait_timeout_s: float,
    logger: Logger = log,
) -> int:
    """Every round of a synchronous job on this site (``exchange`` is the site's own: its writer is the site).

    Round ``r``: wait for global model ``r``; ``validate(r)`` starts scoring it (the model trained from) and may
    return at once with what is :class:`Pending`; ``train(r, validated)`` trains from it meanwhile and calls
    ``validated()`` (:func:`validated_first`) before it publishes update ``r``. The coordinator reads a round's
    validations right after aggregating the round's updates, so each must be on the exchange before its update;
    a validation cost the round its seconds on the critical path when it ran before training. The last global
    model (``rounds``) is only validated. ``validate`` is None when the site has no validation rows. Returns the
    number of rounds this site took part in (resumed ones included).

    Stops early, after logging why, when the coordinator wrote the abort marker (the job failed) or the stop
    marker (training ended early).

    Raises
    ------
    TimeoutError
        When no global model, abort or stop marker appeared within ``wait_timeout_s`` of waiting for one.
    ValidationFailed
        When a validation failed: its round's update is not published.
    """
    site, job_id = exchange.writer, exchange.job_id
    done = 0
    for rnd in range(rounds + 1):
        weights = global_weights(rnd)
        waited = [(weights.manifest, COORDINATOR), (ABORT, COORDINATOR), (STOP, COORDINATOR)]
        if exchange.wait_for_any(waited, wait_timeout_s) is None:
            raise TimeoutError(f"site {site}: no global weights for {weights.name} after {wait_timeout_s:.0f}s")
        if exchange.exists(ABORT, writer=COORDINATOR):
            reason = exchange.get_json(ABORT, writer=COORDINATOR).get("reason")
            logger.warning("coordinator aborted job %s after %d rounds here: %s", job_id, done, reason)
            break
        if exchange.exists(STOP, writer=COORDINATOR):
            reason = exchange.get_json(STOP, writer=COORDINATOR).get("reason")
            logger.info("coordinator stopped job %s early after %d rounds here: %s", job_id, done, reason)
            break
        validated = start_validation(exchange, validate, rnd)
        if rnd == rounds:
            validated()
            break
        if exchange.exists(update(rnd).manifest):
            logger.info("round %d already published by this site (resumed run); skipping", rnd)
        else:
            train(rnd, validated)
        validated()  # published before this site waits for the next global model, whatever train did
        done += 1
    return done


def wait_for_dispatch(exchange: Exchange, phase: str, flow_run_id: str | None, timeout_s: float,
                      poll_s: float = 0.5) -> dict[str, Any] | None:
    """The coordinator's dispatch of ``phase`` on this site once it names this very flow run: a site run that
    finished its rounds goes on to the job's next phase in the same process (no new flow run, no second start of
    its imports), when and only when the coordinator says so. The caller still admits the phase (the site's
    policy, the dispatch's parameters, once) as a run started for it would be.

    Returns None when the coordinator wrote the abort marker instead (the job failed). A dispatch that names
    another run (an earlier attempt's, or a run the coordinator started for this phase instead) is waited past.

    Raises
    ------
    TimeoutError
        When neither came within ``timeout_s``.
    """
    if flow_run_id is None:
        raise TimeoutError(f"site {exchange.writer}: outside a flow run no coordinator dispatches {phase} to it")
    doc, deadline, pause = dispatch(phase, exchange.writer), time.monotonic() + timeout_s, backoff(poll_s)
    while True:
        if exchange.exists(ABORT, writer=COORDINATOR):
            return None
        try:
            record = exchange.get_json(doc, writer=COORDINATOR) if exchange.exists(doc, writer=COORDINATOR) else None
        except ExchangeError:  # a malformed record dispatches nothing: wait for the coordinator's next one
            record = None
        if record is not None and record.get("flow_run_id") == flow_run_id:
            return record
        if time.monotonic() >= deadline:
            raise TimeoutError(f"site {exchange.writer}: the coordinator did not dispatch {phase} of job "
                               f"{exchange.job_id} to flow run {flow_run_id} within {timeout_s:.0f}s")
        time.sleep(min(next(pause), max(0.0, deadline - time.monotonic())))
