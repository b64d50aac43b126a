"""The baseline for ``bench/strategies.py``: bare torchrun scripts, no insitu code, one per strategy.

    torchrun --standalone --nproc-per-node 2 bench/bare_strategies.py ddp --data DIR --state FILE [options]
    torchrun --standalone --nproc-per-node 4 bench/bare_strategies.py hybrid --data DIR --state FILE [options]

The same work as insitu's ranks: the sequence transformer written out here (same structure and parameter names,
so it loads the same starting weights from ``--state``), the same Parquet rows read whole, the same contiguous
block per data-parallel replica, the same seeded order per epoch, the same per-replica batch and micro-batches,
Adam, BCE with ``pos_weight`` 2. Strategies use torch directly: ``ddp`` ``DistributedDataParallel``, ``fsdp``
``fully_shard`` per block then the root, ``pipeline`` ``PipelineStage`` + ``Schedule1F1B`` (blocks split
evenly), ``hybrid`` pipeline stages each ``fully_shard``-ed on a 2-D ``init_device_mesh`` ``(pp, dp_shard)``.
Rank 0 prints one JSON line: samples/s over all replicas (timed around the training loop, as insitu's loop
times itself), the mean training loss, and each rank's parameter + gradient + optimizer-state bytes.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel


class Block(nn.Module):
    def __init__(self, d: int, heads: int, ffn_mult: int) -> None:
        super().__init__()
        self.n_heads = heads
        self.attn_norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.mlp_norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, ffn_mult * d)
        self.down = nn.Linear(ffn_mult * d, d)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, d = h.shape
        q, k, v = self.qkv(self.attn_norm(h)).view(b, t, 3, self.n_heads, d // self.n_heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        h = h + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return h + self.down(F.gelu(self.up(self.mlp_norm(h))))


class StepEmbedding(nn.Module):
    def __init__(self, k: int, seq_len: int, d: int) -> None:
        super().__init__()
        self.seq_len, self.k = seq_len, k
        self.linear = nn.Linear(k, d)
        self.position = nn.Parameter(torch.zeros(seq_len, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.view(x.shape[0], self.seq_len, self.k)) + self.position


class Core(nn.Module):
    def __init__(self, n_features: int, seq_len: int, d: int, heads: int, layers: int, ffn_mult: int) -> None:
        super().__init__()
        self.embed: StepEmbedding | None = StepEmbedding(n_features // seq_len, seq_len, d)
        self.layers = nn.ModuleDict({str(i): Block(d, heads, ffn_mult) for i in range(layers)})
        self.norm: nn.LayerNorm | None = nn.LayerNorm(d)
        self.head: nn.Linear | None = nn.Linear(d, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) if self.embed is not None else x
        for block in self.layers.values():
            h = block(h)
        if self.norm is not None:
            h = self.norm(h)
        return self.head(h[:, -1]) if self.head is not None else h


class Model(nn.Module):
    """Standardised features in, one logit out; a pipeline stage keeps a slice of ``core``."""

    def __init__(self, core: Core, n_features: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(n_features))
        self.register_buffer("std", torch.ones(n_features))
        self.register_buffer("out_shift", torch.tensor(0.0))
        self.register_buffer("out_scale", torch.tensor(1.0))
        self.core = core
        self.first, self.last = True, True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.core(((x - self.mean) / self.std).to(x.dtype) if self.first else x)
        if not self.last:
            return z
        return z.squeeze(-1) * self.out_scale + self.out_shift

    def keep_stage(self, stage: int, n_stages: int) -> None:
        n = len(self.core.layers)
        lo, hi = round(stage * n / n_stages), round((stage + 1) * n / n_stages)
        for i, name in enumerate(list(self.core.layers)):
            if not lo <= i < hi:
                del self.core.layers[name]
        self.first, self.last = stage == 0, stage == n_stages - 1
        if not self.first:
            self.core.embed = None
        if not self.last:
            self.core.norm, self.core.head = None, None


def local_bytes(module: nn.Module, opt: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of this rank's own parameters, gradients and optimizer state (a DTensor counts its local shard)."""

    def nbytes(t: torch.Tensor) -> int:
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    params = list(module.parameters())
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return {"params": sum(nbytes(p) for p in params),
            "grads": sum(nbytes(p.grad) for p in params if p.grad is not None),
            "optim": sum(nbytes(v) for v in state)}


@dataclass
class Trained:
    seen: int
    elapsed: float
    replicas: int
    loss_sum: float
    rows_with_loss: int
    bytes: dict[str, int]


def train(args: argparse.Namespace, x_all: np.ndarray, y_all: np.ndarray, max_steps: int | None = None) -> Trained:
    """Wrap a new model as ``args.strategy`` says and train it (``max_steps``: stop early, for a warm-up)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    model = Model(Core(x_all.shape[1], args.seq_len, args.d_model, args.n_heads, args.n_layers, args.ffn_mult),
                  x_all.shape[1])
    model.load_state_dict(torch.load(args.state, weights_only=True))

    # Which rows this rank reads (its data-parallel replica's block), and what it trains.
    stage = n_stages = group = None
    if args.strategy == "ddp":
        replica, replicas = rank, world
        module: nn.Module = DistributedDataParallel(model, broadcast_buffers=False)
    elif args.strategy == "fsdp":
        replica, replicas = rank, world
        mesh = init_device_mesh("cpu", (world,))
        for block in model.core.layers.values():
            fully_shard(block, mesh=mesh)
        module = fully_shard(model, mesh=mesh)
    elif args.strategy == "pipeline":
        replica, replicas, stage, n_stages = 0, 1, rank, world
        model.keep_stage(stage, n_stages)
        module = model
    else:  # hybrid: (pp, dp_shard) = (2, world // 2)
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("pp", "dp_shard"))
        stage, n_stages = mesh["pp"].get_local_rank(), 2
        replica, replicas = mesh["dp_shard"].get_local_rank(), world // 2
        model.keep_stage(stage, n_stages)
        for block in model.core.layers.values():
            fully_shard(block, mesh=mesh["dp_shard"])
        module = fully_shard(model, mesh=mesh["dp_shard"])
        group = mesh["pp"].get_group()
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(2.0))
    schedule = None
    if stage is not None:
        pipe = PipelineStage(module, stage, n_stages, device, group=group)
        schedule = Schedule1F1B(pipe, n_microbatches=args.microbatches, loss_fn=loss_fn)
    first, last = stage in (None, 0), stage is None or stage == n_stages - 1

    per = len(y_all) // replicas
    rows = slice(replica * per, (replica + 1) * per)
    xt = torch.from_numpy(x_all[rows].copy())  # copies, as insitu's rank parts are
    yt = torch.from_numpy(y_all[rows].copy())
    opt = torch.optim.Adam(module.parameters(), lr=args.lr)
    local = max(1, args.batch // replicas)
    drop_last = schedule is not None  # a pipeline's micro-batch shapes are fixed at the first step
    losses: list[torch.Tensor] = []
    steps, seen, t0 = 0, 0, time.perf_counter()
    for epoch in range(args.epochs):
        order = torch.from_numpy(np.random.default_rng([args.seed, epoch]).permutation(len(xt)))
        for i in range(0, len(order), local):
            idx = order[i : i + local]
            if (drop_last and len(idx) < local) or (max_steps is not None and steps >= max_steps):
                break
            opt.zero_grad(set_to_none=True)
            if schedule is None:
                loss = loss_fn(module(xt[idx]), yt[idx])
                loss.backward()
                losses.append(loss.detach() * len(idx))
            elif first:
                schedule.step(xt[idx])
            elif last:
                mb: list[torch.Tensor] = []
                schedule.step(target=yt[idx], losses=mb)
                losses.append(torch.stack([m.detach() for m in mb]).mean() * len(idx))
            else:
                schedule.step()
            opt.step()
            seen += len(idx)
            steps += 1
    elapsed = time.perf_counter() - t0
    return Trained(seen, elapsed, replicas, float(torch.stack(losses).sum()) if losses else 0.0,
                   seen if (schedule is None or last) else 0, local_bytes(module, opt))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("strategy", choices=["ddp", "fsdp", "pipeline", "hybrid"])
    ap.add_argument("--data", required=True, help="folder of *.parquet (features f*, label)")
    ap.add_argument("--state", required=True, help="starting weights (torch.save of a state dict)")
    ap.add_argument("--seq-len", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--n-heads", type=int, default=4)
    ap.add_argument("--n-layers", type=int, default=4)
    ap.add_argument("--ffn-mult", type=int, default=4)
    ap.add_argument("--batch", type=int, default=128, help="global batch (all replicas)")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup-steps", type=int, default=0,
                    help="first train a throw-away copy for this many steps (untimed), so that the timed run is in a "
                         "warm process, as insitu's long-lived Dask workers are after their first round")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    df = pd.concat([pd.read_parquet(f) for f in sorted(glob.glob(args.data + "/*.parquet"))], ignore_index=True)
    y_all = df.pop("label").to_numpy(np.float32)
    x_all = df.to_numpy(np.float32)
    if args.warmup_steps:
        train(args, x_all, y_all, max_steps=args.warmup_steps)
        dist.barrier()
    t = train(args, x_all, y_all)
    totals = torch.tensor([t.loss_sum, t.rows_with_loss], dtype=torch.float64)
    dist.all_reduce(totals)
    per_rank: list[dict[str, int] | None] = [None] * world
    dist.all_gather_object(per_rank, t.bytes)
    if rank == 0:
        print(json.dumps({"strategy": args.strategy, "ranks": world, "replicas": t.replicas,
                          "samples_per_s": t.seen * t.replicas / t.elapsed, "train_seconds": t.elapsed,
                          "train_loss": float(totals[0] / totals[1]), "bytes_per_rank": per_rank}), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    # Skip the interpreter's teardown: torch 2.13 with gloo sometimes aborts there ("terminate called without an
    # active exception", SIGABRT; 2 of 4 fsdp runs here) after the result was printed, which failed the run.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
