"""How much of a ``retrain`` job is orchestration rather than compute: per phase, per round, Prefect API calls
and flow-run starts per job, where one round's seconds go, and what the idle platform costs.

    .venv/bin/python bench/pipeline_overhead.py --fresh              # its own platform: start, seed, run, stop
    .venv/bin/python bench/pipeline_overhead.py --run                # a job on the running platform (insitu up)
    .venv/bin/python bench/pipeline_overhead.py --flow-run <id>      # analyses a finished retrain run
    .venv/bin/python bench/pipeline_overhead.py --fresh --mode async --rounds 9   # an async job of 9 versions

Compute is what the tasks timed inside (prepare on Dask, each round's training, evaluation); a phase's
overhead is its wall time minus the slowest site's compute (sites run in parallel), a round's overhead
is the time between two aggregations minus the slowest site's training task for that round. An async job
(``federation.mode: async``; ``--mode async`` runs the demo so) has no rounds: its updates are analysed one by one
instead (``bench/async_overhead.py``: each update's cycle minus its train task, the cost per global version).

``--fresh`` starts the Prefect server with its access log on (``PREFECT_SERVER_LOGGING_LEVEL=INFO``), so it
also counts the API calls the job made (every caller: the flows, the workers' polls, the CLI's wait); it adds up
the CPU seconds each platform component used during the job (a worker's: the flow runs it started) and samples
the idle platform's CPU after it (every process the platform started, with their children).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.async_overhead import summarise, update_cycles  # noqa: E402
from bench.demo_job import prefect_at, seed_and_deploy, start_demo_job, wait_final  # noqa: E402
from deployments.platform import REPO, Platform  # noqa: E402
from deployments.poll_pace import ACTIVE_WINDOW_S  # noqa: E402

ACCESS = re.compile(r'"(GET|POST|PUT|PATCH|DELETE) (/api/[^ ?"]*)')
ID = re.compile(r"/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def api_calls(log: Path, start: int, end: int | None = None) -> Counter[str]:
    """The Prefect API calls in the server's access log between two byte offsets, by method and route."""
    with log.open("rb") as f:
        f.seek(start)
        text = f.read(None if end is None else end - start).decode("utf-8", "replace")
    return Counter(f"{m} {ID.sub('/{id}', path)}" for m, path in ACCESS.findall(text))


def cpu_seconds(p: Platform) -> dict[str, float]:
    """CPU seconds each platform component has used so far: its process, its live descendants, and the children
    it waited for (a worker's flow-run processes once they ended)."""
    import psutil

    out = {}
    for name, s in p.status().items():
        if not s.get("pid"):
            continue
        try:
            root = psutil.Process(s["pid"])
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        total = 0.0
        for proc in procs:
            try:
                t = proc.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.NoSuchProcess:
                pass
        out[name] = total
    return out


def cpu_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds per component between two :func:`cpu_seconds`, largest first."""
    used = {name: round(after[name] - t, 1) for name, t in before.items() if name in after}
    return dict(sorted(used.items(), key=lambda kv: -kv[1]))


def idle_cpu(p: Platform, seconds: float) -> dict[str, Any]:
    """Percent of one core each platform component (with its children) used over ``seconds`` of idling."""
    before = cpu_seconds(p)
    time.sleep(seconds)
    per = {name: round(100 * used / seconds, 2) for name, used in cpu_used(before, cpu_seconds(p)).items()}
    return {"seconds": seconds, "total_pct_of_one_core": round(sum(per.values()), 1), "by_component": per}


def analyse(flow_run_id: str) -> dict[str, Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterName, TaskRunFilter

    with get_client(sync_client=True) as c:
        top = c.read_flow_run(flow_run_id)
        job = top.parameters.get("params", {}).get("job_id")
        if not job:
            raise SystemExit("this analysis needs a run with an explicit job_id (use --run or --fresh)")
        kids = c.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=job)))
        kids = [k for k in kids if k.id != top.id]
        ids = [k.id for k in kids] + [top.id]
        tasks = c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)),
                                 task_run_filter=TaskRunFilter(), limit=200)
    dur = {t.name: t.total_run_time.total_seconds() for t in tasks}
    start = {t.name: t.start_time for t in tasks}
    end = {t.name: t.end_time for t in tasks}
    out: dict[str, Any] = {"job_id": job, "wall_s": (top.end_time - top.start_time).total_seconds(),
                           "flow_run_starts": 1 + len(kids),
                           "site_flow_runs": dict(Counter(m.group(1) for k in kids
                                                          if (m := re.match(r"(site-[a-z]+)-", k.name)))),
                           "phases": {}}
    compute_total = slowest_total = 0.0
    # A site's one run does every phase: each phase runs from the previous one's end (the first: the first site
    # run's creation) to the end of its last task (the train phase's: the last round's aggregation).
    phase_start = min((k.created for k in kids), default=top.start_time)
    ends: dict[str, Any] = {}
    phases = (("prepare", r"^prepare-"), ("train", r"^(train-|aggregate-round-|async-update-)"),
              ("evaluate", r"^evaluate-"))
    for phase, pat in phases:
        last = max((end[n] for n in dur if re.match(pat, n) and end[n]), default=None)
        wall = (last - phase_start).total_seconds() if last else 0.0
        ends[phase] = phase_start = last or phase_start
        pat = pat.replace("|aggregate-round-|async-update-", "")  # a site's own compute
        per_site: dict[str, float] = {}
        for name, d in dur.items():
            if re.match(pat, name):
                site = name.split("-")[1]
                per_site[site] = per_site.get(site, 0.0) + d
        compute_total += sum(per_site.values())
        critical = max(per_site.values(), default=0.0)
        slowest_total += critical
        out["phases"][phase] = {"wall_s": round(wall, 2), "slowest_site_compute_s": round(critical, 2),
                                "overhead_s": round(wall - critical, 2)}
    out["slowest_site_compute_s"] = round(slowest_total, 2)
    out["target_wall_s"] = round(1.3 * slowest_total + 20, 1)  # issue #22: 1.3 x the slowest site's compute + 20 s
    rounds = sorted(int(m.group(1)) for n in dur if (m := re.match(r"aggregate-round-(\d+)", n)))
    prev = ends["prepare"]  # round 0 starts once the last site prepared (dispatch, the first global model)
    per_round = []
    for r in rounds:
        agg_end = end[f"aggregate-round-{r}"]
        wall = (agg_end - prev).total_seconds()
        slowest = max((d for n, d in dur.items() if re.match(rf"^train-.+-round-{r}$", n)), default=0.0)
        per_round.append({"round": r, "wall_s": round(wall, 2), "slowest_site_train_s": round(slowest, 2),
                          "overhead_s": round(wall - slowest, 2), "profile": round_profile(r, start, end, prev)})
        prev = agg_end
    out["rounds"] = per_round
    out["compute_s_all_sites"] = round(compute_total, 2)
    steady = [r["overhead_s"] for r in per_round[1:]] or [r["overhead_s"] for r in per_round]
    out["median_round_overhead_s"] = round(median(steady), 2) if steady else None
    cycles = update_cycles(start, end, ends["prepare"])
    if cycles:  # an async job: its updates one by one (the first of each site also pays Dask's first import)
        out["async"] = {**summarise([c for c in cycles if c["seq"] > 0]), "first_updates": summarise(
            [c for c in cycles if c["seq"] == 0]), "updates_detail": cycles}
    return out


def round_profile(r: int, start: dict[str, Any], end: dict[str, Any], published: Any) -> dict[str, float]:
    """Where round ``r``'s seconds went, on its slowest path: from the global model's publication (the previous
    aggregation's end) to a site's validation task starting (its poll noticing it), the validation, the gap to
    the train task, the train task, and from the last update to the aggregation's end (the coordinator's poll,
    reading, checking and aggregating the updates, publishing the next model)."""
    sites = sorted({m.group(1) for n in start if (m := re.match(rf"^train-(.+)-round-{r}$", n))})
    if not sites:
        return {}

    def s(a: Any, b: Any) -> float:
        return (b - a).total_seconds() if a is not None and b is not None else 0.0

    rows = []
    for site in sites:
        v, t = f"validate-{site}-round-{r}", f"train-{site}-round-{r}"
        rows.append({"notice_s": s(published, start.get(v, start[t])), "validate_s": s(start.get(v), end.get(v)),
                     "validate_to_train_s": s(end.get(v), start[t]) if v in end else 0.0,
                     "train_task_s": s(start[t], end[t]), "train_end": end[t]})
    last = max(rows, key=lambda x: x["train_end"])
    agg = f"aggregate-round-{r}"
    return {**{k: round(v, 2) for k, v in last.items() if k != "train_end"},
            "last_update_to_next_global_s": round(s(last["train_end"], end.get(agg)), 2),
            "aggregate_task_s": round(s(start.get(agg), end.get(agg)), 2)}


def async_training(conf: Path) -> str:
    """The demo's training config in async mode (FedAsync, its defaults) beside it in ``conf``; returns its name."""
    import yaml

    cfg = yaml.safe_load((conf / "training" / "fraud.yaml").read_text())
    cfg["federation"] = {**cfg["federation"], "mode": "async", "asynchronous": {"algorithm": "fedasync"}}
    cfg["validation"] = {"select": "last", "patience": 0}  # what async mode requires (it registers the last)
    (conf / "training" / "fraud_async.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return "fraud_async"


def fresh(rows: int, rounds: int, idle_s: float, mode: str = "sync") -> dict[str, Any]:
    """A platform of its own (free ports, access log on): seed, deploy, one demo job, its analysis, idle CPU."""
    with tempfile.TemporaryDirectory(prefix="insitu-overhead-") as tmp:
        conf = Path(tmp) / "conf"
        shutil.copytree(REPO / "conf", conf)
        training = async_training(conf) if mode == "async" else "fraud"
        os.environ["PREFECT_SERVER_LOGGING_LEVEL"] = "INFO"  # the server's access log: one line per API call
        p = Platform(Path(tmp) / "state", conf, free_ports=True)
        p.apply_env()
        log = p.dir / "logs" / "prefect-server.log"
        try:
            t0 = time.perf_counter()
            p.up()
            up_s = time.perf_counter() - t0
            p.apply_env()
            with prefect_at(p):
                seed_and_deploy(p, rows)
                time.sleep(5)
                before = log.stat().st_size
                cpu_before = cpu_seconds(p)
                t0 = time.perf_counter()
                run_id = start_demo_job(p, rounds, "overhead", training)
                (run,) = wait_final([run_id], poll_s=2.0)
                submitted_to_final = time.perf_counter() - t0
                during = log.stat().st_size
                job_cpu = cpu_used(cpu_before, cpu_seconds(p))
                if not run.state.is_completed():
                    raise SystemExit(f"retrain {run.state.name}: {run.state.message}")
                out = analyse(str(run_id))
                time.sleep(ACTIVE_WINDOW_S + 10)  # the job's processes end; the workers' pace turns idle
                quiet = log.stat().st_size
                cpu = idle_cpu(p, idle_s)
                idle_calls = api_calls(log, quiet)
                job_calls = api_calls(log, before, during)
        finally:
            p.down()
    total = sum(job_calls.values())
    out.update({"platform_up_s": round(up_s, 1), "submitted_to_final_s": round(submitted_to_final, 1),
                "prefect_api_calls": total,
                "prefect_api_calls_per_round": round(total / max(1, len(out["rounds"])), 1),
                "prefect_api_top": dict(job_calls.most_common(12)),
                "idle_prefect_api_calls_per_s": round(sum(idle_calls.values()) / idle_s, 2),
                "job_cpu_s": {"total": round(sum(job_cpu.values()), 1), "by_component": job_cpu},
                "idle_cpu": cpu})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--state-dir", default=str(REPO / ".insitu"))
    ap.add_argument("--flow-run", default=None)
    ap.add_argument("--run", action="store_true", help="trigger a retrain job first (platform must be up)")
    ap.add_argument("--fresh", action="store_true", help="start a platform of its own, run a job, stop it")
    ap.add_argument("--rows", type=int, default=20_000, help="rows per site (--fresh)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--idle-s", type=float, default=30.0, help="how long to sample the idle platform (--fresh)")
    ap.add_argument("--mode", choices=("sync", "async"), default="sync",
                    help="the demo's federation mode (--fresh): async runs it with FedAsync, rounds = versions")
    args = ap.parse_args()
    if args.fresh:
        print(json.dumps(fresh(args.rows, args.rounds, args.idle_s, args.mode), default=str))
        return
    if args.mode != "sync":
        raise SystemExit("--mode async needs --fresh (it writes the async training config into its own conf)")
    p = Platform(Path(args.state_dir))
    p.apply_env()
    flow_run = args.flow_run
    if args.run:
        with prefect_at(p):
            run_id = start_demo_job(p, args.rounds, "bench")
            (run,) = wait_final([run_id])
        if not run.state.is_completed():
            raise SystemExit(f"retrain {run.state.name}: {run.state.message}")
        flow_run = str(run_id)
    if not flow_run:
        raise SystemExit("give --flow-run <id>, --run or --fresh")
    print(json.dumps(analyse(flow_run), default=str))


if __name__ == "__main__":
    main()
