"""A deliberately slow site, for tests and benchmarks of straggling sites.

Only the site's own operator can slow it: a file ``publish-delay.json`` beside the site's identity file (in the
site admin's directory, which the site's runtime user can read but not write), ``{"<job id>": seconds}``, makes
the site wait that long after training each update of that job, before it publishes; ``{"<job id>": {"<round>":
seconds}}`` only in those rounds (a synchronous job's round, an async job's global version). A job's configuration
cannot (it comes from whoever created the run), so no caller can slow a site down.
"""

from __future__ import annotations

import json
import math

PUBLISH_DELAY_FILE = "publish-delay.json"
MAX_DELAY_S = 3600.0


def publish_delay(text: str | None, job_id: str, rnd: int | None = None) -> float:
    """Seconds this site waits before publishing its update of ``job_id`` in round ``rnd`` (0 without a file or an
    entry).

    Raises
    ------
    ValueError
        When the file is not a mapping of job ids to seconds between 0 and 3600: an operator's typo is said,
        not ignored.
    """
    if text is None:
        return 0.0
    try:
        entries = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{PUBLISH_DELAY_FILE}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(entries, dict):
        raise ValueError(f"{PUBLISH_DELAY_FILE}: expected {{\"<job id>\": seconds or {{\"<round>\": seconds}}}}, got "
                         f"{type(entries).__name__}")
    seconds = entries.get(job_id, 0.0)
    if isinstance(seconds, dict):  # only in the rounds it names
        seconds = seconds.get(str(rnd), 0.0)
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds) \
            or not 0 <= seconds <= MAX_DELAY_S:
        raise ValueError(f"{PUBLISH_DELAY_FILE}: job {job_id!r}: {seconds!r} is not a number of seconds from 0 to "
                         f"{MAX_DELAY_S:g}")
    return float(seconds)
