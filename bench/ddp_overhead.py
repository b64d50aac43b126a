"""insitu's in-site DDP path vs a bare torchrun DDP script: same model, data, sampler and steps.

    .venv/bin/python bench/ddp_overhead.py --rows 200000 --epochs 2 --repeat 5

Prints the training-loop throughput of each (samples/s, measured inside the loop), the ratio of each
side-by-side pair (insitu run, then bare run) with its median, min and max, plus the end-to-end wall
time of each launch (insitu: Dask launch + rendezvous + data load; bare: torchrun process start-up +
data load). Both run in this one invocation, alternating, so machine noise hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import dask
import torch
from distributed import LocalCluster

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_prepared  # noqa: E402

from insitu.conf import TrainingConfig  # noqa: E402
from insitu.models import build_model  # noqa: E402
from insitu.parallel import DataRef, TrainSpec  # noqa: E402
from insitu.parallel.site import train_site  # noqa: E402
from insitu.specs import task_for_label  # noqa: E402
from insitu.storage import Store  # noqa: E402

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    # As on the platform's site workers (deployments/platform/supervisor.py): no Dask profiler sampling training.
    # Through dask.config, not the environment: distributed is imported already (its config read), and the
    # nannies hand the workers this process's config, so a variable set now would not reach them.
    dask.config.set({"distributed.worker.profile.enabled": False})
    tmp = Path(tempfile.mkdtemp(prefix="insitu-bench-"))
    write_prepared(tmp, args.rows, args.features)
    cfg = TrainingConfig.model_validate({
        "model": {"hidden": [64, 32], "dropout": 0.0}, "optimizer": {"name": "adam", "lr": 0.003},
        "batch_size": args.batch, "local_epochs": args.epochs, "strategy": "ddp", "ranks_per_site": args.ranks,
        "checkpoint": {"enabled": False}})
    torch.manual_seed(0)
    state = build_model(cfg.model, args.features).state_dict()
    data = DataRef(Store(f"file://{tmp}/", {}), "bench", "bench")
    spec = TrainSpec(cfg, task_for_label(), args.features, state, data, {"pos_weight": 2.0}, 1)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)}
    torchrun = str(Path(sys.executable).parent / "torchrun")
    ours, bare, ours_wall, bare_wall = [], [], [], []
    with LocalCluster(n_workers=args.ranks, threads_per_worker=1, processes=True, dashboard_address=None,
                      host="127.0.0.1") as cluster:
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            res = train_site(spec, cluster.scheduler_address)
            ours_wall.append(time.perf_counter() - t0)
            ours.append(res.metrics["samples_per_s"])
            t0 = time.perf_counter()
            out = subprocess.run([torchrun, "--standalone", "--nproc-per-node", str(args.ranks),
                                  str(HERE / "bare_ddp.py"), str(tmp / "prepared/bench/bench/train"),
                                  str(args.batch), str(args.epochs), "1"],
                                 env=env, capture_output=True, text=True, check=True)
            bare_wall.append(time.perf_counter() - t0)
            bare.append(json.loads(out.stdout.strip().splitlines()[-1])["samples_per_s"])
    o, b = statistics.median(ours), statistics.median(bare)
    ratios = [x / y for x, y in zip(ours, bare, strict=True)]
    result = {
        "rows": args.rows, "ranks": args.ranks, "epochs": args.epochs, "batch": args.batch, "pairs": args.repeat,
        "insitu_samples_per_s": round(o), "bare_torchrun_samples_per_s": round(b),
        "throughput_ratio": round(statistics.median(ratios), 3),
        "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3),
        "insitu_wall_s": round(statistics.median(ours_wall), 2), "bare_wall_s": round(statistics.median(bare_wall), 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
