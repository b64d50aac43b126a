"""Riding out a store that is down for a while, with a bound.

An object store restarting, a border cut for half a minute, a region's endpoint failing over: the calls made in
that window fail with a connection error, and the same call a few seconds later succeeds. The S3 client's own
retries (botocore's, a few attempts with random backoff) cover a blip of seconds, not a restart. :class:`Outage`
adds ours on top: it calls again after 1, 2, 4, 8, 16, 16, … s (deterministic, so that an operator can say how
long a job waits) until the store answers, or until ``limit_s`` have passed since the first failure — then it
raises :class:`StoreUnavailable`, which names the store, the call, how long and the bound to raise.

Only an unreachable store is ridden out (refused or reset connections, timeouts): a missing object, a refused
key or a malformed request fails at once, as it would fail again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import botocore.exceptions

from insitu.conf.sites import DEFAULT_OUTAGE_S

log = logging.getLogger(__name__)
T = TypeVar("T")

# What a store that is down (or out of reach) answers: nothing, or a connection that ends. Not an HTTP error:
# a store that answers 403 or 404 is up and has decided.
_UNREACHABLE: tuple[type[BaseException], ...] = (
    ConnectionError,  # refused, reset, aborted (the builtin; also aiohttp's connector errors' causes)
    TimeoutError,
    aiohttp.ClientConnectionError,  # cannot connect, server disconnected, connection reset mid-response
    aiohttp.ClientPayloadError,  # the body broke off
    botocore.exceptions.EndpointConnectionError,
    botocore.exceptions.ConnectionClosedError,
    botocore.exceptions.ConnectTimeoutError,
    botocore.exceptions.ReadTimeoutError,
)


class StoreUnavailable(ConnectionError):
    """A store stayed unreachable for longer than its outage bound."""


def is_unreachable(e: BaseException) -> bool:
    """Whether ``e`` (or what caused it) says the store could not be reached, rather than that it refused."""
    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, StoreUnavailable):
            return False  # already ridden out to its bound: the verdict stands
        if isinstance(cause, _UNREACHABLE):
            return True
        seen.add(id(cause))
        # `raise X from None` hides the context it was raised in: a refusal made while handling a connection error
        # is a refusal
        cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
    return False


@dataclass(frozen=True)
class Outage:
    """How long calls to one store ride out its being unreachable, and how often they try again meanwhile."""

    limit_s: float = DEFAULT_OUTAGE_S
    first_s: float = 1.0
    longest_s: float = 16.0

    def waits(self) -> Iterator[float]:
        """The pauses between tries: 1, 2, 4, 8, 16, 16, … s (the first and longest as configured)."""
        wait = self.first_s
        while True:
            yield wait
            wait = min(wait * 2, self.longest_s)

    def call(self, fn: Callable[..., T], *args: Any, what: str, store: str,
             sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
             **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``, tried again while ``store`` is unreachable, for at most ``limit_s`` seconds.

        Raises
        ------
        StoreUnavailable
            When the store is still unreachable once the next pause would end past ``limit_s`` since the first
            failure; it carries the last error as its cause.
        """
        began: float | None = None
        tries = 0
        waits = self.waits()
        while True:
            tries += 1
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                if not is_unreachable(e):
                    raise
                now = clock()
                began = now if began is None else began
                wait = next(waits)
                down = now - began
                if down + wait > self.limit_s:
                    raise StoreUnavailable(
                        f"store {store} unreachable for {down:.0f} s ({tries} tries of {what}); the bound is "
                        f"{self.limit_s:g} s (outage_s of this store in conf/sites.yaml): "
                        f"{type(e).__name__}: {e}"
                    ) from e
                log.warning("store %s unreachable (%s: %s: %s); trying again in %g s (down %.0f s of at most %g s)",
                            store, what, type(e).__name__, e, wait, down, self.limit_s)
                sleep(wait)
