"""Each site's health at a glance (``insitu status``): is its worker polling, is its queue moving, do its store,
Dask scheduler and audit service answer, and how long did the last job's rounds take.

The facts come from where each one lives: heartbeats and late runs from the Prefect API (what a site on another
host reports too), reachability from the platform's own probes run inside the site's network, round times from
the newest job's summary on the exchange. :func:`problems` turns them into the reasons a site is degraded; it is
pure, so the wording is unit-tested.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from insitu.conf import JOB_ID_PATTERN

log = logging.getLogger(__name__)

# Prefect calls a worker offline after three missed heartbeats; so does this view.
MISSED_HEARTBEATS = 3


@dataclass(frozen=True)
class SiteHealth:
    site: str
    pool: str
    heartbeat_age_s: float | None  # the newest heartbeat of any worker of the site's pool; None: none ever
    heartbeat_interval_s: float
    late_runs: int | None  # flow runs in the site's pool past their start time (None: the API did not answer)
    # each component's health probe, asked inside the site's network; None: not started by this platform (a
    # site started on its own host with `insitu site up` is judged by its heartbeat only)
    components: dict[str, bool | None] = field(default_factory=dict)
    last_job: str | None = None
    round_seconds: list[tuple[int, float | None, bool]] = field(default_factory=list)  # (round, s, site took part)

    def problems(self) -> list[str]:
        """Why the site is degraded (empty: healthy)."""
        why = []
        if self.heartbeat_age_s is None:
            why.append(f"no worker has ever polled its pool {self.pool}")
        elif self.heartbeat_age_s > MISSED_HEARTBEATS * self.heartbeat_interval_s:
            why.append(f"its worker's last heartbeat was {self.heartbeat_age_s:.0f} s ago "
                       f"(expected every {self.heartbeat_interval_s:.0f} s): it does not pick up runs")
        if self.late_runs:
            why.append(f"{self.late_runs} late run(s) in its queue")
        what = {"worker": "its worker process is not running",
                "store": "its store does not answer (inside its network)",
                "dask": "its Dask scheduler does not answer",
                "audit": "its audit service does not answer: the site refuses to read data it cannot audit"}
        why += [what[k] for k, ok in self.components.items() if ok is False]
        missed = [r for r, _, took_part in self.round_seconds if not took_part]
        if missed:
            why.append(f"left out of round(s) {', '.join(map(str, missed))} of job {self.last_job}")
        return why

    def rounds_line(self) -> str:
        if self.last_job is None:
            return "-"
        if not self.round_seconds:
            return f"{self.last_job}: no summary (running, or ended before its summary)"
        times = ", ".join(f"{s:.1f}" if s is not None else "?" for _, s, _ in self.round_seconds)
        return f"{self.last_job}: {times} s"

    def heartbeat_line(self) -> str:
        return "never" if self.heartbeat_age_s is None else f"{self.heartbeat_age_s:.0f} s ago"


def heartbeat_age(workers: list[dict[str, Any]], now: datetime) -> tuple[float | None, float]:
    """Seconds since the newest heartbeat of ``workers`` (Prefect's worker records), and their interval."""
    beats = [(datetime.fromisoformat(w["last_heartbeat_time"]), float(w.get("heartbeat_interval_seconds") or 30))
             for w in workers if w.get("last_heartbeat_time")]
    if not beats:
        return None, 30.0
    last, interval = max(beats)
    return max(0.0, (now - last).total_seconds()), interval


def round_times(summary: dict[str, Any] | None, site: str) -> list[tuple[int, float | None, bool]]:
    """Each round of a job's summary: its seconds (as the coordinator timed it) and whether ``site`` took part."""
    if not summary:
        return []
    return [(int(r["round"]), r.get("seconds"), site in r.get("sites", [])) for r in summary.get("rounds_detail", [])]


class PrefectView:
    """What the Prefect API says of a pool: its workers, its late runs, its newest site run's job."""

    def __init__(self, api_url: str, headers: dict[str, str]) -> None:
        import httpx

        self._http = httpx.Client(base_url=api_url, headers=headers, timeout=5)

    def close(self) -> None:
        self._http.close()

    def workers(self, pool: str) -> list[dict[str, Any]]:
        r = self._http.post(f"/work_pools/{pool}/workers/filter", json={})
        r.raise_for_status()
        return list(r.json())

    def late_runs(self, pool: str) -> int:
        r = self._http.post("/flow_runs/count", json={"work_pools": {"name": {"any_": [pool]}},
                                                      "flow_runs": {"state": {"name": {"any_": ["Late"]}}}})
        r.raise_for_status()
        return int(r.json())

    def newest_job(self, pool: str) -> str | None:
        """The job id of the newest site run in ``pool`` (each site run carries its job's id)."""
        r = self._http.post("/flow_runs/filter", json={"work_pools": {"name": {"any_": [pool]}},
                                                       "sort": "EXPECTED_START_TIME_DESC", "limit": 1})
        r.raise_for_status()
        runs = r.json()
        job = str(runs[0]["parameters"].get("job_id") or "") if runs else ""
        # a run's parameters are the caller's: only a well-formed job id names a place on the exchange to read
        return job if re.fullmatch(JOB_ID_PATTERN, job) else None


def site_health(site: str, pool: str, prefect: PrefectView, components: dict[str, bool | None],
                read_summary: Callable[[str], dict[str, Any] | None], now: datetime | None = None) -> SiteHealth:
    """Gather one site's facts; an API that does not answer leaves its fact unknown rather than failing the view."""
    now = now or datetime.now(UTC)
    try:
        age, interval = heartbeat_age(prefect.workers(pool), now)
    except Exception as e:
        log.warning("could not read the workers of %s: %s", pool, e)
        age, interval = None, 30.0
    try:
        late: int | None = prefect.late_runs(pool)
    except Exception as e:
        log.warning("could not count the late runs of %s: %s", pool, e)
        late = None
    job = None
    try:
        job = prefect.newest_job(pool)
    except Exception as e:
        log.warning("could not find the newest job of %s: %s", pool, e)
    summary = None
    if job is not None:
        try:
            summary = read_summary(job)
        except Exception as e:  # a job still running (or failed) has no summary
            log.debug("no summary for job %s: %s", job, e)
    return SiteHealth(site, pool, age, interval, late, components, job, round_times(summary, site))
