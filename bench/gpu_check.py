"""The accelerator check: insitu's sequence transformer under insitu's FSDP or DDP, one rank per GPU.

    torchrun --standalone --nproc-per-node <gpus> bench/gpu_check.py --strategy fsdp --size large
    torchrun --standalone --nproc-per-node 2 bench/gpu_check.py --strategy fsdp --size tiny     # CPU, CI

Builds the model with ``insitu.models.build_model`` (``sequence_transformer``) and wraps it with insitu's own
code: ``fsdp`` is ``insitu.parallel.fsdp.apply_fsdp`` (each block a unit; on GPU bf16 compute,
``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``), ``ddp`` is
``insitu.parallel.ddp.parallelize`` (DistributedDataParallel with insitu's comm-timing hook; on GPU the forward
and loss run under ``torch.autocast(bfloat16)``). nccl on GPU, gloo and fp32 on CPU. It trains with AdamW on
synthetic sequences (random steps, a label from the first feature) for ``--warmup`` untimed and ``--steps``
timed steps and prints, over all ranks:

- tokens/s, tokens = global batch × seq_len (``--batch`` is per rank),
- step time (mean of the timed steps, synchronised before and after),
- peak memory per rank, ``torch.cuda.max_memory_allocated`` (the largest rank; n/a on CPU),
- MFU = FLOPs per step / step time / (peak FLOP/s per GPU × GPUs), with

      FLOPs per step = (6 · N + 12 · n_layers · d_model · seq_len) · tokens per step

  (N: every parameter of the model, the dense matmuls' forward + backward; the second term is attention's
  scores and weighted sum, as in the PaLM / nanoGPT estimate). The peak is ``--peak-tflops`` or, by device
  name, dense bf16: H100/H200 989, A100 312 TFLOP/s; on an unknown device or the CPU MFU is n/a.

Sizes (``--size``; ``--seq-len``, ``--batch`` and the model options below override them): ``tiny`` (runs on
two CPU cores in seconds), ``medium`` (~25 M parameters), ``large`` (d_model 1024, 24 layers, 16 heads:
~302 M parameters). The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's insitu, whatever is installed
from insitu.conf import TrainingConfig  # noqa: E402
from insitu.models import build_model  # noqa: E402
from insitu.parallel import DataRef, TrainSpec  # noqa: E402
from insitu.parallel.loop import make_optimizer  # noqa: E402
from insitu.specs import task_for_label  # noqa: E402
from insitu.storage import Store  # noqa: E402

SIZES: dict[str, dict[str, int]] = {
    "tiny": {"d_model": 32, "n_layers": 2, "n_heads": 4, "seq_len": 8, "batch": 16, "steps": 5, "warmup": 2},
    "medium": {"d_model": 512, "n_layers": 8, "n_heads": 8, "seq_len": 128, "batch": 32, "steps": 20, "warmup": 5},
    "large": {"d_model": 1024, "n_layers": 24, "n_heads": 16, "seq_len": 128, "batch": 32, "steps": 20,
              "warmup": 5},
}
STEP_FEATURES = 16  # features per sequence step (the input is seq_len · 16 wide)
# Dense bf16 peak per GPU, TFLOP/s, by a substring of torch.cuda.get_device_name().
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}
FLOPS_FORMULA = "(6·N + 12·n_layers·d_model·seq_len) · tokens"


def peak_tflops(given: float | None, cuda: bool) -> float | None:
    if given is not None:
        return given
    if not cuda:
        return None
    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_TFLOPS.items() if k in name), None)


def train_step(module: torch.nn.Module, opt: torch.optim.Optimizer, loss_fn: Callable[..., torch.Tensor],
               batch: tuple[torch.Tensor, torch.Tensor], autocast: bool) -> torch.Tensor:
    x, y = batch
    opt.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
        loss = loss_fn(module(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strategy", choices=["fsdp", "ddp"], default="fsdp")
    ap.add_argument("--size", choices=list(SIZES), default="tiny")
    for opt in ("d-model", "n-layers", "n-heads", "seq-len", "batch", "steps", "warmup"):
        ap.add_argument(f"--{opt}", type=int, default=None, help="overrides the size's value")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--peak-tflops", type=float, default=None, help="peak FLOP/s per device, in TFLOP/s")
    args = ap.parse_args()
    size = {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in SIZES[args.size].items()}

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")  # env:// from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = torch.device(f"cuda:{torch.cuda.current_device()}")
    else:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        device = torch.device("cpu")
    seq_len, batch = size["seq_len"], size["batch"]
    n_features = seq_len * STEP_FEATURES
    cfg = TrainingConfig.model_validate({
        "model": {"name": "sequence_transformer", "dropout": 0.0,
                  "options": {"seq_len": seq_len, "d_model": size["d_model"], "n_heads": size["n_heads"],
                              "n_layers": size["n_layers"]}},
        "optimizer": {"name": "adamw", "lr": args.lr}, "batch_size": batch * world, "strategy": args.strategy,
        "ranks_per_site": world, "parallel": {"fsdp": {"mixed_precision": "auto"}},  # auto: bf16 on GPU only
        "checkpoint": {"enabled": False}})
    task = task_for_label()
    torch.manual_seed(0)
    model = build_model(cfg.model, n_features, task.n_outputs)
    n_params = sum(p.numel() for p in model.parameters())
    model = model.to(device)
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))
    if args.strategy == "fsdp":
        from insitu.parallel.fsdp import Options, apply_fsdp

        module = apply_fsdp(model, mesh, Options.model_validate(cfg.parallel).fsdp, device)
    else:
        from insitu.parallel.ddp import parallelize

        # ddp.parallelize reads nothing of the spec but its type; the data reference is never opened.
        spec = TrainSpec(cfg, task, n_features, {}, DataRef(Store("memory://gpu-check/"), "synthetic", "none"),
                         {"pos_weight": 1.0}, 0)
        module = parallelize(model, mesh, spec).module
    autocast = cuda and args.strategy == "ddp"
    loss_fn = task.loss({"pos_weight": 1.0}, device)
    opt = make_optimizer(module, cfg)
    gen = torch.Generator(device=device).manual_seed(1 + rank)
    batches = []
    for _ in range(4):  # a few distinct batches, made on the device up front: no input pipeline in the timing
        x = torch.randn(batch, n_features, device=device, generator=gen)
        batches.append((x, (x[:, 0] > 0).float()))

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    first = last = None
    for i in range(size["warmup"]):
        loss = train_step(module, opt, loss_fn, batches[i % len(batches)], autocast)
        first = first if first is not None else float(loss)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    dist.barrier()
    sync()
    t0 = time.perf_counter()
    for i in range(size["steps"]):
        loss = train_step(module, opt, loss_fn, batches[i % len(batches)], autocast)
    sync()
    elapsed = time.perf_counter() - t0
    last = float(loss)
    # The slowest rank's time is the step time; the largest rank's peak is the memory that must fit.
    stats = torch.tensor([elapsed, torch.cuda.max_memory_allocated() if cuda else 0.0], dtype=torch.float64,
                         device=device)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    step_s = float(stats[0]) / size["steps"]
    tokens_per_step = batch * world * seq_len
    flops_per_step = (6 * n_params + 12 * size["n_layers"] * size["d_model"] * seq_len) * tokens_per_step
    peak = peak_tflops(args.peak_tflops, cuda)
    mfu = flops_per_step / step_s / (peak * 1e12 * world) if peak else None
    result: dict[str, Any] = {
        "strategy": args.strategy, "size": args.size, "device": torch.cuda.get_device_name() if cuda else "cpu",
        "backend": dist.get_backend(), "ranks": world, "dtype": "bf16" if cuda else "fp32",
        "parameters": n_params, "d_model": size["d_model"], "n_layers": size["n_layers"],
        "n_heads": size["n_heads"], "seq_len": seq_len, "batch_per_rank": batch, "steps": size["steps"],
        "tokens_per_s": tokens_per_step / step_s, "step_s": step_s,
        "peak_memory_bytes": int(stats[1]) if cuda else None,
        "tflops_per_s_per_rank": flops_per_step / step_s / world / 1e12, "peak_tflops": peak, "mfu": mfu,
        "flops_formula": FLOPS_FORMULA, "loss_first": first, "loss_last": last,
    }
    if rank == 0:
        mem = f"{result['peak_memory_bytes'] / 2**30:.2f} GiB" if cuda else "n/a (CPU)"
        print(f"{args.strategy} {args.size}: {n_params:,} parameters, {world} × {result['device']} "
              f"({result['backend']}, {result['dtype']}), batch {batch}/rank × seq_len {seq_len}")
        print(f"tokens/s {result['tokens_per_s']:,.0f}   step {step_s * 1e3:.1f} ms   peak memory/rank {mem}   "
              f"MFU {f'{mfu:.1%}' if mfu is not None else 'n/a'} (FLOPs/step = {FLOPS_FORMULA} = "
              f"{flops_per_step:.3g}; {result['tflops_per_s_per_rank']:.3g} TFLOP/s per rank"
              f"{f' of {peak:g}' if peak else ''})   loss {first:.4f} -> {last:.4f}")
        print(json.dumps(result), flush=True)
    dist.barrier()
    del module, model, opt
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
