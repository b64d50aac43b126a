"""`insitu status`'s per-site view (pure logic): heartbeat age from Prefect's worker records, the last job's round
times from its summary, and the reasons a site is called degraded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from deployments.platform.site_health import SiteHealth, heartbeat_age, round_times, site_health

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def test_the_newest_heartbeat_of_the_pools_workers_counts() -> None:
    workers = [{"last_heartbeat_time": (NOW - timedelta(seconds=40)).isoformat(), "heartbeat_interval_seconds": 30},
               {"last_heartbeat_time": (NOW - timedelta(seconds=5)).isoformat(), "heartbeat_interval_seconds": 10},
               {"last_heartbeat_time": None}]
    assert heartbeat_age(workers, NOW) == (5.0, 10.0)
    assert heartbeat_age([], NOW) == (None, 30.0)


def test_round_times_say_whether_the_site_took_part() -> None:
    summary = {"rounds_detail": [{"round": 0, "sites": ["eu", "us"], "seconds": 4.2},
                                 {"round": 1, "sites": ["us"], "missing": ["eu"], "seconds": 31.0},
                                 {"round": 2, "sites": ["eu", "us"]}]}  # reused from an earlier run: no time
    assert round_times(summary, "eu") == [(0, 4.2, True), (1, 31.0, False), (2, None, True)]
    assert round_times(None, "eu") == []


def test_a_healthy_site_has_no_problems_and_each_fault_is_named() -> None:
    ok = SiteHealth("eu", "insitu-eu", 3.0, 30.0, 0, {"worker": True, "store": True, "dask": True, "audit": True},
                    "job-1", [(0, 4.2, True), (1, 3.9, True)])
    assert ok.problems() == [] and ok.rounds_line() == "job-1: 4.2, 3.9 s" and ok.heartbeat_line() == "3 s ago"
    bad = SiteHealth("eu", "insitu-eu", 200.0, 30.0, 2, {"worker": False, "store": False, "dask": None,
                                                          "audit": False}, "job-1", [(0, 4.2, True), (1, 30, False)])
    why = bad.problems()
    assert why[0].startswith("its worker's last heartbeat was 200 s ago (expected every 30 s)")
    assert "2 late run(s) in its queue" in why
    assert "its worker process is not running" in why and "its store does not answer (inside its network)" in why
    assert any(w.startswith("its audit service does not answer") for w in why)
    assert not any("Dask" in w for w in why)  # not started by this platform: unknown, not degraded
    assert "left out of round(s) 1 of job job-1" in why
    never = SiteHealth("us", "insitu-us", None, 30.0, None, {}, None)
    assert never.problems() == ["no worker has ever polled its pool insitu-us"] and never.rounds_line() == "-"


class _Prefect:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def workers(self, pool: str) -> list[dict[str, Any]]:
        if self.fail:
            raise ConnectionError("refused")
        return [{"last_heartbeat_time": (NOW - timedelta(seconds=2)).isoformat(), "heartbeat_interval_seconds": 30}]

    def late_runs(self, pool: str) -> int:
        if self.fail:
            raise ConnectionError("refused")
        return 1

    def newest_job(self, pool: str) -> str | None:
        return "job-7"


def test_an_api_that_does_not_answer_leaves_the_fact_unknown() -> None:
    summary = {"rounds_detail": [{"round": 0, "sites": ["eu"], "seconds": 2.0}]}
    h = site_health("eu", "insitu-eu", _Prefect(), {}, lambda job: summary if job == "job-7" else None, NOW)  # type: ignore[arg-type]
    assert (h.heartbeat_age_s, h.late_runs, h.last_job, h.round_seconds) == (2.0, 1, "job-7", [(0, 2.0, True)])
    down = site_health("eu", "insitu-eu", _Prefect(fail=True), {}, lambda job: None, NOW)  # type: ignore[arg-type]
    assert down.heartbeat_age_s is None and down.late_runs is None
    assert down.rounds_line() == "job-7: no summary (running, or ended before its summary)"
