"""A site's side of an async job (``federation.mode: async``), as plain code: pull the newest global version,
validate it (once per version), train an update from it, push it; repeat until the coordinator reaches its
target version or aborts.

The counterpart of :mod:`.server` (the coordinator's parameter server). The Prefect layer passes in what the
site does (its tasks: train and publish update ``seq`` from version ``v``, score version ``v`` on the validation
split) and its run logger; the protocol's rules are here, unit-tested with an exchange on an in-memory store:

- one update in flight per site: before training again the site waits until the coordinator decided its last
  update, so it trains from the version that decision made (:func:`wait_for_decision`);
- a refusal is noted once (:func:`note_refusal`); the site pulls the newest version before training anyway;
- a site pushes at most ``limit`` updates in a job (the coordinator budgets the same), then only waits for the
  final version;
- a re-run continues the site's numbering (:func:`next_async_seq`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from insitu.federated.exchange import Exchange
from insitu.federated.kinds import COORDINATOR
from insitu.federated.paths import ABORT, ASYNC_STATE, NEWEST, async_update, refresh
from insitu.federated.site_rounds import Pending, start_validation

log = logging.getLogger(__name__)

Logger = logging.Logger | logging.LoggerAdapter

# How long a site that reached its update limit waits for an abort before it looks at the newest version again.
AT_LIMIT_POLL_S = 1.0


def run_site_updates(
    exchange: Exchange,
    limit: int,
    *,
    train: Callable[[int, int, Callable[[], None]], object],
    validate: Callable[[int], Pending | None] | None,
    wait_timeout_s: float,
    logger: Logger = log,
    poll_s: float = 0.3,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """This site's updates of an async job (``exchange`` is the site's own: its writer is the site).

    ``train(seq, version, validated)`` trains the site's update ``seq`` from global version ``version`` and
    publishes it; ``validate(version)`` scores a version on the validation split and publishes the metrics (None:
    the site has no validation rows), and may return at once with what is
    :class:`~insitu.federated.site_rounds.Pending`, as in sync mode: training waits for it (``validated()``)
    before it publishes. Every version the site pulls is
    validated once, the final one always, so the final model's evaluation and gate work as in sync mode.
    ``poll_s``, ``clock`` and ``sleep`` pace the wait for each decision. Returns the number of updates pushed by
    this run.

    Raises
    ------
    TimeoutError
        When neither a global version nor the abort marker appeared within ``wait_timeout_s``.
    ValidationFailed
        When a validation failed: the update trained meanwhile is not published.
    """
    site, job_id = exchange.writer, exchange.job_id
    seq = next_async_seq(exchange)  # a re-run of the job continues this site's numbering
    pushed, refusals_seen = 0, -1
    while True:
        if pushed:  # one update in flight per site: the next one trains from the version its decision made
            wait_for_decision(exchange, seq - 1, wait_timeout_s, poll_s, clock, sleep)
        waited = [(NEWEST, COORDINATOR), (ABORT, COORDINATOR)]
        if exchange.wait_for_any(waited, wait_timeout_s) is None:
            raise TimeoutError(f"site {site}: no global version published after {wait_timeout_s:.0f}s")
        if exchange.exists(ABORT, writer=COORDINATOR):
            reason = exchange.get_json(ABORT, writer=COORDINATOR).get("reason")
            logger.warning("coordinator aborted job %s after %d update(s) here: %s", job_id, pushed, reason)
            break
        newest = exchange.get_json(NEWEST, writer=COORDINATOR)
        version = newest["version"]
        validated = start_validation(exchange, validate, version)
        if version >= newest["target"]:
            validated()
            logger.info("version %d reached: site %s stops after %d update(s)", version, site, pushed)
            break
        refusals_seen = note_refusal(exchange, refusals_seen, logger)
        if seq >= limit:  # the protocol's bound: wait for the target version (and validate it), push no more
            validated()
            logger.warning("site %s pushed its %d updates (the limit of this job); waiting for the final version",
                           site, limit)
            exchange.wait_for_any([(ABORT, COORDINATOR)], timeout=AT_LIMIT_POLL_S)
            continue
        train(seq, version, validated)
        validated()
        seq, pushed = seq + 1, pushed + 1
    return pushed


def wait_for_decision(
    exchange: Exchange,
    seq: int,
    timeout_s: float,
    poll_s: float = 0.3,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Wait until the coordinator decided this site's update ``seq`` (applied, buffered or refused), the job
    reached its target version, or it was aborted; after ``timeout_s`` go on anyway.

    Without it a site that trains faster than the coordinator decides queues updates that are stale by the time
    they are read (measured on the local platform: most of them refused, the coordinator a queue behind).
    """
    site = exchange.writer
    deadline = clock() + timeout_s
    while clock() < deadline:
        if exchange.exists(ABORT, writer=COORDINATOR):
            return
        newest = exchange.get_json(NEWEST, writer=COORDINATOR)
        if newest["version"] >= newest["target"]:
            return
        if exchange.exists(ASYNC_STATE, writer=COORDINATOR):
            state = exchange.get_json(ASYNC_STATE, writer=COORDINATOR)
            # Decided, and the newest pointer caught up with the state: the coordinator writes the state before
            # the pointer, so a site that pulled in between would retrain from the version its update replaced
            # (and, at a low max_staleness, be refused for it).
            if state["next_seq"].get(site, 0) > seq and newest["version"] >= state["version"]:
                return
        sleep(poll_s)


def next_async_seq(exchange: Exchange) -> int:
    """The sequence number of this site's next update: one past the last it published in this job.

    Found by asking for each in turn (a site publishes them in order, so the first missing one is next), not by
    listing: a site's credential may read its own objects on the exchange but not list the bucket.
    """
    seq = 0
    while exchange.exists(async_update(seq).manifest):
        seq += 1
    return seq


def note_refusal(exchange: Exchange, seen: int, logger: Logger = log) -> int:
    """Log the coordinator's newest refusal of this site's updates (once); returns the seq it was about.

    Nothing else to do about it: the site pulls the newest version before it trains again anyway.
    """
    site = exchange.writer
    if not exchange.exists(refresh(site), writer=COORDINATOR):
        return seen
    notice = exchange.get_json(refresh(site), writer=COORDINATOR)
    if notice["seq"] != seen:
        logger.warning("site %s: update %d was refused by the coordinator (%s); refreshing to version %d",
                       site, notice["seq"], notice["reason"], notice["version"])
    return int(notice["seq"])
