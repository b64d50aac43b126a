"""The control plane on SQLite vs PostgreSQL: platform start, job wall and Prefect API latency under jobs.

    .venv/bin/python bench/control_plane.py                      # both databases, 2 jobs at once, 3 rounds
    .venv/bin/python bench/control_plane.py --jobs 1 --rows 20000 --rounds 5

For each database, one after the other on this machine: a fresh platform in a temporary directory (free ports) is
started cold, stopped and started warm; the demo data is seeded and deployed; ``--jobs`` demo jobs run at once
(the load under which SQLite answered ``503 database is locked``) while a probe reads and writes the Prefect API
every 0.25 s (a flow-run filter, a flow run created and its state set: what a worker and a flow do). Prints one JSON
line per database, then one with the PostgreSQL / SQLite ratios.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from deployments.platform import REPO, Platform
from deployments.platform.health import prefect_headers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.demo_job import prefect_at, seed_and_deploy, start_demo_job, wait_final  # noqa: E402


def summarize(latencies_ms: list[float]) -> dict[str, float | int]:
    """Median, 95th percentile and maximum of the probe's latencies (ms)."""
    if not latencies_ms:
        return {"n": 0}
    xs = sorted(latencies_ms)
    return {"n": len(xs), "p50_ms": round(statistics.median(xs), 1),
            "p95_ms": round(xs[min(len(xs) - 1, int(0.95 * len(xs)))], 1), "max_ms": round(xs[-1], 1)}


class Probe(threading.Thread):
    """Reads and writes the Prefect API every ``period`` seconds, timing each call; counts server errors."""

    def __init__(self, api: str, auth: str, period: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.api, self.headers, self.period = api, prefect_headers(auth), period
        self.read_ms: list[float] = []
        self.write_ms: list[float] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def _timed(self, c: httpx.Client, out: list[float], method: str, path: str, body: dict[str, Any]) -> Any:
        t = time.perf_counter()
        try:
            r = c.request(method, path, json=body)
        except httpx.HTTPError as e:
            self.errors.append(type(e).__name__)
            return None
        out.append((time.perf_counter() - t) * 1000)
        if r.status_code >= 500:
            self.errors.append(str(r.status_code))
            return None
        return r.json()

    def run(self) -> None:
        with httpx.Client(base_url=self.api, headers=self.headers, timeout=60) as c:
            flow = c.post("/flows/", json={"name": "bench-control-plane-probe"}).json()
            while not self.stop.is_set():
                self._timed(c, self.read_ms, "POST", "/flow_runs/filter", {"limit": 10})
                run = self._timed(c, self.write_ms, "POST", "/flow_runs/",
                                  {"flow_id": flow["id"], "name": f"probe-{uuid.uuid4().hex[:8]}"})
                if run:
                    self._timed(c, self.write_ms, "POST", f"/flow_runs/{run['id']}/set_state",
                                {"state": {"type": "RUNNING"}, "force": True})
                self.stop.wait(self.period)


def measure(database: str, rows: int, rounds: int, jobs: int) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(prefix=f"insitu-bench-{database}-"))
    p = Platform(state, REPO / "conf", free_ports=True, database=database)
    out: dict[str, Any] = {"database": database, "rows_per_site": rows, "rounds": rounds, "jobs_at_once": jobs}
    try:
        p.apply_env()
        out["start_cold_s"] = round(p.up()["seconds"], 1)
        p.down()
        out["start_warm_s"] = round(p.up()["seconds"], 1)
        p.apply_env()
        with prefect_at(p):
            seed_and_deploy(p, rows)
            probe = Probe(p.prefect_api_url, p.prefect_auth)
            probe.start()
            time.sleep(5)  # the idle platform's latency first
            idle = (summarize(probe.read_ms), summarize(probe.write_ms))
            n_read, n_write = len(probe.read_ms), len(probe.write_ms)
            t0 = time.monotonic()
            runs = wait_final([start_demo_job(p, rounds, "bench-cp") for _ in range(jobs)])
            probe.stop.set()
            probe.join()
            out["jobs_wall_s"] = round(time.monotonic() - t0, 1)
            out["job_run_s"] = [round((r.end_time - r.start_time).total_seconds(), 1) if r.start_time else None
                                for r in runs]
            out["job_states"] = [r.state_name for r in runs]
            failed = [r.state.message for r in runs if not r.state.is_completed()]
            if failed:
                out["job_failures"] = failed
            out["api_idle"] = {"read": idle[0], "write": idle[1]}
            out["api_under_jobs"] = {"read": summarize(probe.read_ms[n_read:]),
                                     "write": summarize(probe.write_ms[n_write:])}
            out["api_5xx_or_errors"] = len(probe.errors)
            server_log = p.dir / "logs" / "prefect-server.log"
            out["server_log_database_locked"] = server_log.read_text(errors="replace").count("database is locked")
    finally:
        p.down()
        shutil.rmtree(state, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--databases", nargs="+", default=["sqlite", "postgres"], choices=["sqlite", "postgres"])
    ap.add_argument("--rows", type=int, default=3000, help="rows per site")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2, help="demo jobs run at once")
    args = ap.parse_args()
    results = {}
    for db in args.databases:
        results[db] = measure(db, args.rows, args.rounds, args.jobs)
        print(json.dumps(results[db]), flush=True)
    if {"sqlite", "postgres"} <= set(results):
        s, pg = results["sqlite"], results["postgres"]

        def ratio(a: float | None, b: float | None) -> float | None:
            return round(a / b, 2) if a and b else None

        print(json.dumps({"postgres_over_sqlite": {
            "start_cold": ratio(pg["start_cold_s"], s["start_cold_s"]),
            "start_warm": ratio(pg["start_warm_s"], s["start_warm_s"]),
            "jobs_wall": ratio(pg["jobs_wall_s"], s["jobs_wall_s"]),
            "api_write_p95_under_jobs": ratio(pg["api_under_jobs"]["write"].get("p95_ms"),
                                              s["api_under_jobs"]["write"].get("p95_ms")),
            "api_read_p95_under_jobs": ratio(pg["api_under_jobs"]["read"].get("p95_ms"),
                                             s["api_under_jobs"]["read"].get("p95_ms"))}}), flush=True)


if __name__ == "__main__":
    main()
