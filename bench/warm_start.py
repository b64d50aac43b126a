"""What a flow run's process costs to start: a new Python importing the runner and an actor's flows (how a worker
started each run before ``deployments/warm_start.py``, and still does with ``--cold-start``) against a fork of a
fork server that imported them once (how it starts each run now). Side by side, in one run.

    .venv/bin/python bench/warm_start.py [--role site] [--starts 5]

Prints one JSON line: per start, the wall and CPU seconds of each way, their ratios, and what the fork server's one
import costs (paid once, when the worker starts). The rest of a run's start (Prefect's engine reading the run,
proposing its states) is the same both ways and not measured here; ``bench/pipeline_overhead.py`` measures jobs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from deployments.warm_start import preload_modules  # noqa: E402


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cold(modules: list[str], starts: int) -> tuple[list[float], list[float]]:
    """``starts`` new Pythons, each importing ``modules``: wall and CPU seconds of each."""
    walls, cpus = [], []
    for _ in range(starts):
        cpu0, t0 = _child_cpu(), time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import {', '.join(modules)}"], check=True, cwd=REPO)
        walls.append(time.perf_counter() - t0)
        cpus.append(_child_cpu() - cpu0)
    return walls, cpus


def _forked(modules: list[str], conn: multiprocessing.connection.Connection) -> None:
    import importlib

    for m in modules:  # already imported by the fork server: what a run finds
        importlib.import_module(m)
    conn.send(time.process_time())  # a fork's CPU clock starts at zero
    conn.close()


def warm(modules: list[str], starts: int) -> tuple[float, list[float], list[float]]:
    """A fork server preloading ``modules`` (its start and imports timed until its first fork is back), then
    ``starts`` forks of it: wall and CPU seconds of each."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(modules)
    t0 = time.perf_counter()
    multiprocessing.forkserver.ensure_running()
    walls, cpus = [], []
    preload_s = 0.0
    for i in range(starts + 1):
        receive, send = ctx.Pipe(duplex=False)
        t1 = time.perf_counter()
        p = ctx.Process(target=_forked, args=(modules, send))
        p.start()
        send.close()
        cpu = receive.recv()
        p.join()
        if i == 0:  # the first fork waits for the server's imports
            preload_s = time.perf_counter() - t0
            continue
        walls.append(time.perf_counter() - t1)
        cpus.append(cpu)
    return preload_s, walls, cpus


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", default="site", choices=["site", "coordinator"])
    ap.add_argument("--starts", type=int, default=5)
    args = ap.parse_args()
    modules = preload_modules(args.role)
    cold_wall, cold_cpu = cold(modules, args.starts)
    preload_s, warm_wall, warm_cpu = warm(modules, args.starts)
    cw, cc = statistics.median(cold_wall), statistics.median(cold_cpu)
    ww, wc = statistics.median(warm_wall), statistics.median(warm_cpu)
    print(json.dumps({
        "role": args.role, "modules": modules, "starts": args.starts,
        "cold_wall_s": round(cw, 3), "cold_cpu_s": round(cc, 3),
        "warm_wall_s": round(ww, 4), "warm_cpu_s": round(wc, 4),
        "wall_ratio_cold_over_warm": round(cw / max(ww, 1e-6), 1),
        "cpu_saved_per_start_s": round(cc - wc, 2),
        "fork_server_preload_wall_s": round(preload_s, 2),
    }))


if __name__ == "__main__":
    main()
