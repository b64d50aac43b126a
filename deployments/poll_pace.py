"""When a worker asks the Prefect API for scheduled runs: every ``PREFECT_WORKER_QUERY_SECONDS`` for a while after
one of its pool's runs was scheduled, submitted, started or ended, seldom otherwise.

Four workers asking every second were two thirds of the idle platform's Prefect server and PostgreSQL load
(about 10% of a core of the server's alone, measured by stopping the workers; bench/pipeline_overhead.py measures
the whole platform); asking every 3 s, still a third. A worker hears of a run scheduled in its pool from the
server's event stream (deployments/pool_events.py) and turns active at once, so its idle poll is only the safety
net for an event missed (the stream reconnecting): once per :data:`IDLE_POLL_S`. A run that is going does not
keep its worker asking every second: a site's one run does every phase of its job (the coordinator dispatches
them to it), so what comes next for the pool is a run of its own, whose scheduling is an event.
"""

from __future__ import annotations

import time
from collections.abc import Callable

IDLE_POLL_S = 15.0  # how often an idle worker asks (a missed event's run waits at most this)
ACTIVE_WINDOW_S = 30.0  # how long after a run was submitted, started or ended a worker asks every query interval


class PollPace:
    """Decides, on each tick of the worker's polling loop, whether this tick asks the API."""

    def __init__(self, idle_s: float = IDLE_POLL_S, active_window_s: float = ACTIVE_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_s, self.active_window_s, self._clock = idle_s, active_window_s, clock
        self._active_until = clock() + active_window_s  # a worker that just started may have runs waiting
        self._next_idle = 0.0

    def active(self) -> None:
        """A run was submitted, started or ended: ask every tick for a while."""
        self._active_until = self._clock() + self.active_window_s

    def due(self) -> bool:
        """Whether this tick asks: always within the active window, else once per ``idle_s``."""
        now = self._clock()
        if now < self._active_until or now >= self._next_idle:
            self._next_idle = now + self.idle_s
            return True
        return False
