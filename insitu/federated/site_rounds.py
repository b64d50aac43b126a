"""A site's side of the synchronous round protocol, as plain code: wait for each global model, validate it,
train from it, until the last round, an early stop or an abort.

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
from typing import Any

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


def site_wait_timeout_s(round_deadline_s: float) -> float:
    """How long a site waits for the next global model: twice the coordinator's round deadline, plus a margin."""
    return 2 * round_deadline_s + SITE_WAIT_MARGIN_S


def run_site_rounds(
    exchange: Exchange,
    rounds: int,
    *,
    train: Callable[[int], object],
    validate: Callable[[int], object] | None,
    wait_timeout_s: float,
    logger: Logger = log,
) -> int:
    """Every round of a synchronous job on this site (``exchange`` is the site's own: its writer is the site).

    Round ``r``: wait for global model ``r``, ``validate(r)`` it (the model trained from), then ``train(r)``
    (train from it and publish update ``r``); the last global model (``rounds``) is only validated. The
    coordinator combines the validations into its early-stopping and selection decisions. ``validate`` is None
    when the site has no validation rows. Returns the number of rounds this site took part in (resumed ones
    included).

    Stops early, after logging why, when the coordinator wrote the abort marker (the job failed) or the stop
    marker (training ended early).

    Raises
    ------
    TimeoutError
        When no global model, abort or stop marker appeared within ``wait_timeout_s`` of waiting for one.
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
        if validate is not None and not exchange.exists(validation(rnd)):
            validate(rnd)
        if rnd == rounds:
            break
        if exchange.exists(update(rnd).manifest):
            logger.info("round %d already published by this site (resumed run); skipping", rnd)
        else:
            train(rnd)
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
