"""Sync rounds against async updates on the demo's fraud data with one deliberately slow site.

    .venv/bin/python bench/async_vs_sync.py                 # 10 versions, us 1.0 s slower per update, < 1 min

Everything runs in this process (no Prefect, no stores), with the data, model and local training of
bench/aggregators.py: three sites (eu, us, apac), non-IID, 50/30/20 % of the rows. Each site is a thread that
really trains (torch, one thread each) and then sleeps ``--delay`` seconds if it is the slow site: the
what a site's operator does with ``publish-delay.json`` on a real site. Wall time is measured, not modelled.

- **sync**: ``--versions`` rounds; every round each site trains the global model, the slowest is waited for,
  FedAvg (by samples) makes the next global model.
- **async** (one row per configuration): the sites loop pull newest → train → (delay) → push, and the
  parameter server (insitu.federated.asynchronous, as a job's coordinator runs it) applies updates as they
  arrive until it has made ``--versions`` global versions; updates beyond ``max_staleness`` are refused.

Both stop at the same number of applied global versions (the last row: async until it has applied as many site
updates as sync did). Prints a markdown table (wall time, final PR-AUC on the pooled test set, site updates
applied and how many of them came from the slow site, refused, mean staleness) and, on its last line, the rows
as JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
import queue
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
from aggregators import Job, SiteData, make_job, pr_auc, train_local

from insitu.conf import AsyncConfig
from insitu.federated.aggregators import FedAvg, Update
from insitu.federated.asynchronous import ServerState, SiteUpdate, build_algorithm

State = dict[str, torch.Tensor]


@dataclass
class Setting:
    label: str
    config: AsyncConfig | None  # None: sync rounds
    versions_per_round: int = 1  # > 1: as many versions as sync's rounds made site updates


def settings() -> list[Setting]:
    return [
        Setting("sync (FedAvg rounds)", None),
        Setting("async fedasync α=0.6, poly a=0.5, max_staleness 4",
                AsyncConfig(algorithm="fedasync", alpha=0.6, max_staleness=4)),
        Setting("async fedasync α=0.6, poly a=0.5, no bound",
                AsyncConfig(algorithm="fedasync", alpha=0.6, max_staleness=10000)),
        Setting("async fedbuff K=2 η=1, poly a=0.5, max_staleness 4",
                AsyncConfig(algorithm="fedbuff", alpha=1.0, buffer_size=2, max_staleness=4)),
        Setting("async fedasync α=0.6, poly a=0.5, max_staleness 4, 3× the versions (sync's site updates)",
                AsyncConfig(algorithm="fedasync", alpha=0.6, max_staleness=4), versions_per_round=3),
    ]


def _train(job: Job, site: SiteData, state: State, seed: int, args: argparse.Namespace) -> State:
    model = _fresh_model(job)
    model.load_state_dict(state)
    torch.manual_seed(seed)
    train_local(model, site, {}, args.lr, args.batch, args.local_epochs, job.pos_weight, seed)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _fresh_model(job: Job) -> torch.nn.Module:
    return copy.deepcopy(job.model)  # one model per thread: the sites train at the same time


def _delay(site: SiteData, args: argparse.Namespace) -> float:
    return args.delay if site.name == args.slow else 0.0


def run_sync(job: Job, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    g = {k: v.clone() for k, v in job.init.items()}
    for rnd in range(args.versions):
        out: dict[str, State] = {}

        def site_round(i: int, site: SiteData, rnd: int = rnd, base: State = g,
                       out: dict[str, State] = out) -> None:
            out[site.name] = _train(job, site, base, job.seed * 100_003 + rnd * 101 + i, args)
            time.sleep(_delay(site, args))

        threads = [threading.Thread(target=site_round, args=(i, s)) for i, s in enumerate(job.sites)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        g, _ = FedAvg().aggregate(rnd, g, [Update(s.name, out[s.name], len(s.y)) for s in job.sites], None)
    wall = time.perf_counter() - t0
    return {"versions": args.versions, "wall_s": wall, "final_pr_auc": _score(job, g),
            "applied": args.versions * len(job.sites), "from_slow_site": args.versions, "refused": 0,
            "mean_staleness": 0.0}


def run_async(job: Job, config: AsyncConfig, args: argparse.Namespace, target: int) -> dict[str, Any]:
    algo = build_algorithm(config)
    lock = threading.Lock()
    versions: dict[int, State] = {0: {k: v.clone() for k, v in job.init.items()}}
    newest = [0]
    stop = threading.Event()
    inbox: queue.Queue[SiteUpdate] = queue.Queue()

    def site_loop(i: int, site: SiteData) -> None:
        seq = 0
        while not stop.is_set():
            with lock:
                v = newest[0]
                base = versions[v]
            state = _train(job, site, base, job.seed * 100_003 + 500 + seq * 101 + i, args)
            time.sleep(_delay(site, args))
            if stop.is_set():
                return
            inbox.put(SiteUpdate(site.name, seq, v, state, base, len(site.y)))
            seq += 1

    t0 = time.perf_counter()
    threads = [threading.Thread(target=site_loop, args=(i, s), daemon=True) for i, s in enumerate(job.sites)]
    for t in threads:
        t.start()
    server, applied, refused, stale, slow = ServerState(), 0, 0, [], 0
    while server.version < target:
        update = inbox.get()
        d = algo.receive(server, versions[server.version], update)
        if not d.receipt.accepted:
            refused += 1
            continue
        stale.append(d.receipt.staleness)
        applied += 1
        slow += update.site == args.slow
        server = d.state
        if d.global_state is not None:
            with lock:
                versions[server.version] = d.global_state
                newest[0] = server.version
    wall = time.perf_counter() - t0
    stop.set()
    for t in threads:
        t.join()
    return {"versions": server.version, "wall_s": wall, "final_pr_auc": _score(job, versions[server.version]),
            "applied": applied, "from_slow_site": slow, "refused": refused,
            "mean_staleness": statistics.fmean(stale) if stale else 0.0}


def _score(job: Job, state: State) -> float:
    model = _fresh_model(job)
    model.load_state_dict(state)
    return pr_auc(model, job.test_x, job.test_y)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=15_000, help="rows over all sites, before the train/val/test split")
    ap.add_argument("--test-rows", type=int, default=30_000, help="pooled test rows (from other shards)")
    ap.add_argument("--versions", type=int, default=10, help="global versions (sync: rounds) to make")
    ap.add_argument("--slow", default="us", help="the deliberately slow site")
    ap.add_argument("--delay", type=float, default=1.0, help="seconds the slow site waits before each push")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--local-epochs", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="tiny run to prove the script works")
    args = ap.parse_args()
    if args.smoke:
        args.rows, args.test_rows, args.versions, args.delay = 3000, 1000, 2, 0.3
    torch.set_num_threads(1)  # what a small site worker gets; also keeps runs comparable across machines
    job = make_job(argparse.Namespace(rows=args.rows, test_rows=args.test_rows), args.seed)
    if args.slow not in {s.name for s in job.sites}:
        ap.error(f"--slow {args.slow!r}: the sites are {[s.name for s in job.sites]}")
    _train(job, SiteData("warm-up", job.sites[0].x[:512], job.sites[0].y[:512]), job.init, 0, args)  # untimed

    rows = []
    for s in settings():
        r = run_sync(job, args) if s.config is None else \
            run_async(job, s.config, args, args.versions * s.versions_per_round)
        rows.append({"setting": s.label, "mode": "sync" if s.config is None else "async", **r})
    sync_wall = rows[0]["wall_s"]
    print(f"{len(job.sites)} sites ({', '.join(f'{s.name} {len(s.y)}' for s in job.sites)} training rows; "
          f"{len(job.test_y)} pooled test rows), {args.versions} global versions each, site {args.slow} "
          f"{args.delay:g} s slower per update, seed {args.seed}\n")
    print("| setting | versions | wall s | vs sync | final PR-AUC | site updates applied (from the slow site) "
          "| refused | mean staleness |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['setting']} | {r['versions']} | {r['wall_s']:.1f} | {r['wall_s'] / sync_wall:.2f}x "
              f"| {r['final_pr_auc']:.3f} | {r['applied']} ({r['from_slow_site']}) | {r['refused']} "
              f"| {r['mean_staleness']:.2f} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
