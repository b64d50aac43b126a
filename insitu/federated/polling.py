"""How often a wait looks again: soon at first, then less often.

Most hand-offs of a round (a global model published, an update arrived) are seen within a few tenths of a
second of the wait starting, so a fixed half-second poll made each one cost a quarter-second on average, five
or six times per round. A wait that goes on (a site still training) settles at the caller's interval, so an
idle wait asks the store no more often than before.
"""

from __future__ import annotations

from collections.abc import Iterator

FIRST_S = 0.05  # the first pause of every wait


def backoff(longest_s: float, first_s: float = FIRST_S) -> Iterator[float]:
    """Pauses that double from ``first_s`` up to ``longest_s`` (and stay there)."""
    pause = min(first_s, longest_s)
    while True:
        yield pause
        pause = min(pause * 2, longest_s)
