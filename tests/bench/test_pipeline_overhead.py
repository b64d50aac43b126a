"""bench/pipeline_overhead.py's own arithmetic: the API calls it counts in the access log, a round's profile.

The analysis of a real job runs in tests/e2e/test_ui_trigger.py; the whole bench (a platform of its own) is too
slow for CI and is run by hand (docs/benchmarks.md)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from pipeline_overhead import api_calls, round_profile  # noqa: E402

LOG = """\
INFO:     127.0.0.1:50312 - "POST /api/work_pools/insitu-eu/get_scheduled_flow_runs HTTP/1.1" 200 OK
INFO:     127.0.0.1:50318 - "GET /api/flow_runs/1c8a3f52-0b7e-4c55-9a3e-2f0c6d1e9b10 HTTP/1.1" 200 OK
some other line of the server
INFO:     127.0.0.1:50320 - "GET /api/flow_runs/9d0e1f2a-3b4c-4d5e-8f6a-7b8c9d0e1f2a HTTP/1.1" 200 OK
INFO:     127.0.0.1:50321 - "POST /api/logs/?x=1 HTTP/1.1" 201 Created
"""


def test_api_calls_are_counted_by_method_and_route_between_offsets(tmp_path: Path) -> None:
    log = tmp_path / "prefect-server.log"
    log.write_text(LOG)
    assert api_calls(log, 0) == {"POST /api/work_pools/insitu-eu/get_scheduled_flow_runs": 1,
                                 "GET /api/flow_runs/{id}": 2, "POST /api/logs/": 1}
    first = len(LOG.splitlines(keepends=True)[0])
    assert sum(api_calls(log, first, len(LOG)).values()) == 3


def test_a_round_profile_follows_its_slowest_site() -> None:
    t0 = datetime(2026, 12, 6, tzinfo=UTC)

    def at(s: float) -> datetime:
        return t0 + timedelta(seconds=s)

    start = {"validate-eu-round-1": at(0.5), "train-eu-round-1": at(1.5), "validate-us-round-1": at(0.2),
             "train-us-round-1": at(1.0), "aggregate-round-1": at(0.1)}
    end = {"validate-eu-round-1": at(1.4), "train-eu-round-1": at(6.0), "validate-us-round-1": at(0.9),
           "train-us-round-1": at(5.0), "aggregate-round-1": at(6.75)}
    assert round_profile(1, start, end, t0) == {
        "notice_s": 0.5, "validate_s": 0.9, "validate_to_train_s": 0.1, "train_task_s": 4.5,
        "last_update_to_next_global_s": 0.75, "aggregate_task_s": 6.65}
    assert round_profile(2, start, end, t0) == {}


def test_an_async_update_cycle_runs_from_its_sites_last_decision_to_its_own() -> None:
    from async_overhead import summarise, update_cycles

    t0 = datetime(2026, 12, 7, tzinfo=UTC)

    def at(s: float) -> datetime:
        return t0 + timedelta(seconds=s)

    # eu: update 0 from version 0 (validating it first), update 1 from version 2 (its validation's task starting
    # just after the training's, beside it), update 2 never decided (the job reached its target); us: update 0
    # from version 0, which eu had validated, not us
    start = {"validate-eu-round-0": at(1.0), "train-eu-async-0-from-v0": at(2.0),
             "train-eu-async-1-from-v2": at(10.0), "validate-eu-round-2": at(10.25),
             "train-eu-async-2-from-v3": at(20.0), "train-us-async-0-from-v0": at(0.5)}
    end = {"validate-eu-round-0": at(1.5), "train-eu-async-0-from-v0": at(6.0), "async-update-eu-0": at(9.0),
           "train-eu-async-1-from-v2": at(14.0), "validate-eu-round-2": at(11.0), "async-update-eu-1": at(16.0),
           "train-eu-async-2-from-v3": at(24.0), "train-us-async-0-from-v0": at(4.5), "async-update-us-0": at(5.0)}
    rows = update_cycles(start, end, t0)
    assert [(r["site"], r["seq"]) for r in rows] == [("eu", 0), ("eu", 1), ("us", 0)]
    assert rows[0] == {"site": "eu", "seq": 0, "from_version": 0, "train_task_s": 4.0, "cycle_s": 9.0,
                       "overhead_s": 5.0, "notice_s": 1.0, "validate_s": 0.5, "validate_to_train_s": 0.5,
                       "decided_s": 3.0}
    assert rows[1]["cycle_s"] == 7.0 and rows[1]["overhead_s"] == 3.0 and rows[1]["notice_s"] == 1.0
    assert rows[1]["validate_s"] == 0.75 and rows[1]["validate_to_train_s"] == -1.0 and rows[1]["decided_s"] == 2.0
    assert rows[2]["notice_s"] == 0.5 and rows[2]["validate_s"] == 0.0 and rows[2]["overhead_s"] == 1.0
    assert summarise(rows)["median_overhead_s"] == 3.0 and summarise(rows)["updates"] == 3
    assert summarise([]) == {"updates": 0}
