"""How much of a ``retrain`` job is orchestration rather than compute, per phase and per round.

    .venv/bin/insitu up && .venv/bin/insitu seed && .venv/bin/insitu deploy
    .venv/bin/python bench/pipeline_overhead.py --run            # runs a job, then analyses it
    .venv/bin/python bench/pipeline_overhead.py --flow-run <id>  # analyses a finished retrain run

Compute is what the tasks timed inside (prepare on Dask, each round's training, evaluation); a phase's
overhead is its wall time minus the slowest site's compute (sites run in parallel), a round's overhead
is the time between two aggregations minus the slowest site's training task for that round.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from deployments.platform import REPO, Platform


def analyse(flow_run_id: str) -> dict[str, Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterName, TaskRunFilter

    with get_client(sync_client=True) as c:
        top = c.read_flow_run(flow_run_id)
        job = top.parameters.get("params", {}).get("job_id")
        if not job:
            raise SystemExit("this analysis needs a run with an explicit job_id (use --run)")
        kids = c.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=job)))
        ids = [k.id for k in kids] + [top.id]
        tasks = c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)),
                                 task_run_filter=TaskRunFilter(), limit=200)
    dur = {t.name: t.total_run_time.total_seconds() for t in tasks}
    end = {t.name: t.end_time for t in tasks}
    out: dict[str, Any] = {"job_id": job, "wall_s": (top.end_time - top.start_time).total_seconds(), "phases": {}}
    compute_total = 0.0
    for phase, pat in (("prepare", r"^prepare-"), ("train", r"^train-"), ("evaluate", r"^evaluate-")):
        runs = [k for k in kids if k.name.startswith(f"site-{phase}")]
        wall = (max(k.end_time for k in runs) - min(k.created for k in runs)).total_seconds()
        per_site: dict[str, float] = {}
        for name, d in dur.items():
            if re.match(pat, name):
                site = name.split("-")[1]
                per_site[site] = per_site.get(site, 0.0) + d
        compute_total += sum(per_site.values())
        critical = max(per_site.values(), default=0.0)
        out["phases"][phase] = {"wall_s": round(wall, 2), "slowest_site_compute_s": round(critical, 2),
                                "overhead_s": round(wall - critical, 2)}
    rounds = sorted(int(m.group(1)) for n in dur if (m := re.match(r"aggregate-round-(\d+)", n)))
    prev = min(k.created for k in kids if k.name.startswith("site-train"))
    per_round = []
    for r in rounds:
        agg_end = end[f"aggregate-round-{r}"]
        wall = (agg_end - prev).total_seconds()
        slowest = max((d for n, d in dur.items() if re.match(rf"^train-.+-round-{r}$", n)), default=0.0)
        per_round.append({"round": r, "wall_s": round(wall, 2), "slowest_site_train_s": round(slowest, 2),
                          "overhead_s": round(wall - slowest, 2)})
        prev = agg_end
    out["rounds"] = per_round
    out["compute_s_all_sites"] = round(compute_total, 2)
    steady = [r["overhead_s"] for r in per_round[1:]] or [r["overhead_s"] for r in per_round]
    out["median_round_overhead_s"] = round(sorted(steady)[len(steady) // 2], 2) if steady else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--state-dir", default=str(REPO / ".insitu"))
    ap.add_argument("--flow-run", default=None)
    ap.add_argument("--run", action="store_true", help="trigger a retrain job first (platform must be up)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    p = Platform(Path(args.state_dir))
    p.apply_env()
    flow_run = args.flow_run
    if args.run:
        import uuid

        from prefect.deployments import run_deployment

        job = f"bench-{uuid.uuid4().hex[:8]}"
        fr = run_deployment("retrain/coordinator", parameters={"params": {"job_id": job, "rounds": args.rounds}},
                            timeout=3600, poll_interval=2)
        if not fr.state.is_completed():
            raise SystemExit(f"retrain {fr.state.name}: {fr.state.message}")
        flow_run = str(fr.id)
    if not flow_run:
        raise SystemExit("give --flow-run <id> or --run")
    print(json.dumps(analyse(flow_run), default=str))


if __name__ == "__main__":
    main()
