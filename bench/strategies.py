"""insitu's in-site strategies vs bare torchrun scripts doing the same: throughput, and memory per rank.

    .venv/bin/python bench/strategies.py --repeat 3 [--out strategies.json]

For each strategy (``ddp``, ``fsdp``, ``pipeline`` 1F1B and ``hybrid`` ``{pp: 2, dp_shard: 2}`` on 4 ranks) the
sequence transformer trains through insitu's real path, ``train_site(spec, dask_address)`` on a ``LocalCluster``
with one single-thread worker per rank and no checkpoints, and through ``bench/bare_strategies.py`` under
``torchrun`` (no insitu code: the same model, starting weights, rows, rank blocks, seeded order, batch,
micro-batches and steps). The two alternate ``--repeat`` times (which goes first alternates too), so machine
noise hits both alike; each pair gives one ratio insitu/bare of the training loop's samples/s. The training
losses of the two sides are printed too: they match when both did the same work.

Memory: one more run per strategy through insitu's own ``parallelize`` and optimizer, as the ranks' payload of
``insitu.parallel.launch.launch_on_dask``: after one step each rank counts its local parameter, gradient and
optimizer-state bytes (DTensors by their local shard), and the CUDA peak when there is a GPU. The table shows
the largest rank's bytes, its ratio to DDP's and the ideal ``1/N`` (a shard of everything); the FSDP target is
``≤ 1.1/N`` (within 10 % of the ideal). Prints a markdown table and, last, one JSON line; ``--out`` writes it.
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
from typing import Any

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
STRATEGIES = ("ddp", "fsdp", "pipeline", "hybrid")
FSDP_TARGET = 1.10  # FSDP's bytes per rank within 10 % of DDP's / N


def ranks_of(strategy: str, ranks: int) -> int:
    return 4 if strategy == "hybrid" else ranks


def make_spec(args: argparse.Namespace, strategy: str, data: DataRef, n_features: int) -> TrainSpec:
    cfg = TrainingConfig.model_validate({
        "model": {"name": "sequence_transformer", "dropout": 0.0,
                  "options": {"seq_len": args.seq_len, "d_model": args.d_model, "n_heads": args.n_heads,
                              "n_layers": args.n_layers, "ffn_mult": args.ffn_mult}},
        "optimizer": {"name": "adam", "lr": args.lr}, "batch_size": args.batch, "local_epochs": args.epochs,
        "strategy": strategy, "ranks_per_site": ranks_of(strategy, args.ranks),
        "parallel": {"pipeline": {"schedule": "1f1b", "microbatches": args.microbatches},
                     "mesh": {"pp": 2, "dp_shard": 2} if strategy == "hybrid" else {}},
        "checkpoint": {"enabled": False}})
    torch.manual_seed(0)
    state = build_model(cfg.model, n_features).state_dict()
    return TrainSpec(cfg, task_for_label(), n_features, state, data, {"pos_weight": 2.0}, args.seed)


def memory_payload(rank: int, world: int, spec: TrainSpec) -> dict[str, Any]:
    """One rank, as ``rank_main`` sets it up (mesh, ``parallelize``, its rows, insitu's optimizer), after one
    step: its local parameter, gradient and optimizer-state bytes."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from insitu.data.loader import load_rank_part_cached
    from insitu.parallel.loop import make_optimizer
    from insitu.parallel.rank import data_replica, mesh_dims
    from insitu.parallel.strategies import strategy as strategy_named

    strategy = strategy_named(spec.training.strategy)
    nccl = dist.get_backend() == "nccl"
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if nccl else torch.device("cpu")
    if nccl:
        torch.cuda.reset_peak_memory_stats()
    model = build_model(spec.training.model, spec.n_features, spec.task.n_outputs)
    model.load_state_dict(spec.state)
    model = model.to(device)
    dims = mesh_dims(strategy, world, spec.training)
    mesh = init_device_mesh(device.type, tuple(dims.values()), mesh_dim_names=tuple(dims))
    wrapped = strategy.parallelize(model, mesh, spec)
    replica, replicas = data_replica(mesh)
    part = load_rank_part_cached(spec.data.store, spec.data.dataset, spec.data.job_id, spec.data.split, replica,
                                 replicas)
    local = spec.training.batch_size // replicas
    x, y = torch.from_numpy(part.x[:local]).to(device), torch.from_numpy(part.y[:local]).to(device)
    opt = make_optimizer(wrapped.module, spec.training)
    opt.zero_grad(set_to_none=True)
    if wrapped.step is not None:
        wrapped.step(x, y)
    else:
        spec.task.loss(spec.loss_params, device)(wrapped.module(x), y).backward()
    opt.step()

    def nbytes(t: torch.Tensor) -> int:
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    params = list(wrapped.module.parameters())
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    out: dict[str, Any] = {"params": sum(nbytes(p) for p in params),
                           "grads": sum(nbytes(p.grad) for p in params if p.grad is not None),
                           "optim": sum(nbytes(v) for v in state)}
    if nccl:
        out["cuda_max_allocated"] = torch.cuda.max_memory_allocated()
    del wrapped, opt
    return out


def median_ratio(ours: list[float], bare: list[float]) -> tuple[float, float, float]:
    ratios = [a / b for a, b in zip(ours, bare, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--seq-len", type=int, default=8)
    ap.add_argument("--step-features", type=int, default=4, help="features per step (n_features = seq_len · this)")
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--n-heads", type=int, default=4)
    ap.add_argument("--n-layers", type=int, default=4)
    ap.add_argument("--ffn-mult", type=int, default=4)
    ap.add_argument("--batch", type=int, default=128, help="the site's global batch (all replicas)")
    ap.add_argument("--microbatches", type=int, default=4, help="per step, pipeline and hybrid")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ranks", type=int, default=2, help="ranks of ddp, fsdp and pipeline (hybrid: always 4)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bare-warmup-steps", type=int, default=2,
                    help="the bare script first trains a throw-away copy this many steps (untimed): insitu's ranks "
                         "run in Dask workers that are already warm (imports, lazily built caches) from the memory "
                         "run and earlier rounds; 0 compares against a cold torchrun process")
    ap.add_argument("--out", default=None, help="write the JSON result here too")
    args = ap.parse_args()
    strategies = [s for s in args.strategies.split(",") if s]
    unknown = sorted(set(strategies) - set(STRATEGIES))
    if unknown:
        raise SystemExit(f"unknown strategies {unknown}; have {list(STRATEGIES)}")
    # As on the platform's site workers (deployments/platform/supervisor.py): no Dask profiler sampling training.
    # Through dask.config, not the environment: distributed is imported already (its config read), and the
    # nannies hand the workers this process's config, so a variable set now would not reach them.
    dask.config.set({"distributed.worker.profile.enabled": False})
    n_features = args.seq_len * args.step_features
    tmp = Path(tempfile.mkdtemp(prefix="insitu-bench-strategies-"))
    write_prepared(tmp, args.rows, n_features)
    data = DataRef(Store(f"file://{tmp}/", {}), "bench", "bench")
    specs = {s: make_spec(args, s, data, n_features) for s in strategies}
    state_file = tmp / "state.pt"
    torch.save(next(iter(specs.values())).state, state_file)  # the same starting weights for every run
    n_params = sum(v.numel() for k, v in specs[strategies[0]].state.items() if k.startswith("core."))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)}
    torchrun = str(Path(sys.executable).parent / "torchrun")
    bare_args = ["--data", str(tmp / "prepared/bench/bench/train"), "--state", str(state_file),
                 "--seq-len", str(args.seq_len), "--d-model", str(args.d_model), "--n-heads", str(args.n_heads),
                 "--n-layers", str(args.n_layers), "--ffn-mult", str(args.ffn_mult), "--batch", str(args.batch),
                 "--microbatches", str(args.microbatches), "--epochs", str(args.epochs), "--lr", str(args.lr),
                 "--seed", str(args.seed), "--warmup-steps", str(args.bare_warmup_steps)]

    def run_bare(strategy: str) -> tuple[dict[str, Any], float]:
        t0 = time.perf_counter()
        out = subprocess.run([torchrun, "--standalone", "--nproc-per-node", str(ranks_of(strategy, args.ranks)),
                              str(HERE / "bare_strategies.py"), strategy, *bare_args],
                             env=env, capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            raise RuntimeError(f"bare {strategy} failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1]), time.perf_counter() - t0

    runs: dict[str, dict[str, list[Any]]] = {s: {"insitu": [], "bare": [], "insitu_wall": [], "bare_wall": [],
                                                 "insitu_loss": [], "bare_loss": []} for s in strategies}
    memory: dict[str, dict[str, Any]] = {}
    workers = max(ranks_of(s, args.ranks) for s in strategies)
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                      host="127.0.0.1") as cluster:
        from insitu.parallel.launch import launch_on_dask

        for s in strategies:
            per_rank = launch_on_dask(cluster.scheduler_address, memory_payload, ranks_of(s, args.ranks), specs[s])
            memory[s] = {"per_rank": per_rank}
        for i in range(args.repeat):
            for s in strategies:
                for side in (("insitu", "bare") if i % 2 == 0 else ("bare", "insitu")):
                    if side == "insitu":
                        t0 = time.perf_counter()
                        res = train_site(specs[s], cluster.scheduler_address)
                        runs[s]["insitu_wall"].append(time.perf_counter() - t0)
                        runs[s]["insitu"].append(res.metrics["samples_per_s"])
                        runs[s]["insitu_loss"].append(res.metrics["train_loss"])
                    else:
                        b, wall = run_bare(s)
                        runs[s]["bare"].append(b["samples_per_s"])
                        runs[s]["bare_wall"].append(wall)
                        runs[s]["bare_loss"].append(b["train_loss"])
                        memory[s]["bare_per_rank"] = b["bytes_per_rank"]
                    got = runs[s][side][-1]
                    print(f"pair {i + 1}/{args.repeat} {s} {side}: {got:,.0f} samples/s", file=sys.stderr, flush=True)

    def total(d: dict[str, Any]) -> int:
        return int(d["params"] + d["grads"] + d["optim"])

    ddp_bytes = max(total(r) for r in memory["ddp"]["per_rank"]) if "ddp" in memory else None
    rows: list[dict[str, Any]] = []
    for s in strategies:
        r = runs[s]
        med, lo, hi = median_ratio(r["insitu"], r["bare"])
        n = ranks_of(s, args.ranks)
        peak = max(memory[s]["per_rank"], key=total)
        peak_bytes = total(peak)
        row: dict[str, Any] = {
            "strategy": s, "ranks": n, "pairs": args.repeat,
            "insitu_samples_per_s": round(statistics.median(r["insitu"]), 1),
            "bare_samples_per_s": round(statistics.median(r["bare"]), 1),
            "ratio_median": round(med, 3), "ratio_min": round(lo, 3), "ratio_max": round(hi, 3),
            "insitu_wall_s": round(statistics.median(r["insitu_wall"]), 2),
            "bare_wall_s": round(statistics.median(r["bare_wall"]), 2),
            "insitu_train_loss": round(statistics.median(r["insitu_loss"]), 6),
            "bare_train_loss": round(statistics.median(r["bare_loss"]), 6),
            "bytes_per_rank_max": peak_bytes, "params_bytes": int(peak["params"]), "grads_bytes": int(peak["grads"]),
            "optim_bytes": int(peak["optim"]),
            "bytes_per_rank": [total(x) for x in memory[s]["per_rank"]],
            "bare_bytes_per_rank": [total(x) for x in memory[s].get("bare_per_rank", [])],
            "ideal_vs_ddp": round(1 / n, 4) if s != "ddp" else 1.0,
        }
        if "cuda_max_allocated" in peak:
            row["cuda_max_allocated"] = max(x["cuda_max_allocated"] for x in memory[s]["per_rank"])
        if ddp_bytes:
            row["vs_ddp"] = round(peak_bytes / ddp_bytes, 4)
        if s == "fsdp" and ddp_bytes:
            row["target_vs_ddp"] = round(FSDP_TARGET / n, 4)
            row["target_met"] = peak_bytes / ddp_bytes <= FSDP_TARGET / n
        rows.append(row)

    print(f"sequence_transformer: d_model {args.d_model}, {args.n_layers} layers, {args.n_heads} heads, seq_len "
          f"{args.seq_len}, {n_params:,} parameters; {args.rows:,} rows, batch {args.batch}, "
          f"{args.microbatches} micro-batches, {args.epochs} epoch(s), Adam; CPU, gloo, 1 thread per rank; bare "
          f"processes warmed up {args.bare_warmup_steps} untimed steps\n")
    print("| strategy | ranks | insitu samples/s | bare samples/s | ratio insitu/bare: median (min–max) "
          "| train loss insitu / bare |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row['strategy']} | {row['ranks']} | {row['insitu_samples_per_s']:,.0f} | "
              f"{row['bare_samples_per_s']:,.0f} | **{row['ratio_median']:.2f}** ({row['ratio_min']:.2f}–"
              f"{row['ratio_max']:.2f}) | {row['insitu_train_loss']:.4f} / {row['bare_train_loss']:.4f} |")
    print()
    cuda = any("cuda_max_allocated" in row for row in rows)
    print("| strategy | ranks | params + grads + optimizer state, largest rank (KiB) | vs DDP | ideal 1/N | "
          "target | bare script's largest rank (KiB) |" + (" CUDA peak (MiB) |" if cuda else ""))
    print("| --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if cuda else ""))
    for row in rows:
        target = (f"≤ {row['target_vs_ddp']:.3f} {'met' if row['target_met'] else 'MISSED'}"
                  if "target_vs_ddp" in row else "")
        bare_kib = f"{max(row['bare_bytes_per_rank']) / 1024:,.1f}" if row["bare_bytes_per_rank"] else ""
        line = (f"| {row['strategy']} | {row['ranks']} | {row['bytes_per_rank_max'] / 1024:,.1f} "
                f"(p {row['params_bytes'] / 1024:,.1f} + g {row['grads_bytes'] / 1024:,.1f} + "
                f"o {row['optim_bytes'] / 1024:,.1f}) | {row.get('vs_ddp', float('nan')):.3f} | "
                f"{row['ideal_vs_ddp']:.3f} | {target} | {bare_kib} |")
        if cuda:
            line += f" {row.get('cuda_max_allocated', 0) / 2**20:,.1f} |"
        print(line)
    print()
    result = {"model": {"d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads,
                        "seq_len": args.seq_len, "parameters": n_params},
              "rows": args.rows, "batch": args.batch, "microbatches": args.microbatches, "epochs": args.epochs,
              "bare_warmup_steps": args.bare_warmup_steps,
              "strategies": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
