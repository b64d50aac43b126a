"""Strategy ``ddp``: synchronous data parallelism with ``DistributedDataParallel``.

Every rank holds the whole model, trains on its part of the site's rows and all-reduces gradients
(ring all-reduce via the backend: gloo on CPU, nccl on CUDA). Communication time is measured with a
comm hook that wraps the default all-reduce.
"""

# No `from __future__ import annotations`: DDP checks the comm hook's annotations at runtime.

import logging
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from insitu.data.loader import load_split_cached
from insitu.models.fraud_mlp import build_model
from insitu.parallel.checkpoint import Checkpointer
from insitu.parallel.loop import rank_rows, train_epochs
from insitu.parallel.types import TrainResult, TrainSpec

log = logging.getLogger(__name__)


class CommTimer:
    """Wall time from launching each bucket's all-reduce until its result is ready."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def hook(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        t0 = time.perf_counter()
        fut = default_hooks.allreduce_hook(state, bucket)

        def done(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            self.seconds += time.perf_counter() - t0
            self.calls += 1
            return f.value()

        return fut.then(done)


def parallelize(model: nn.Module, device: torch.device | None = None) -> tuple[nn.Module, CommTimer]:
    """Wrap ``model`` in DDP with a timing comm hook (needs an initialised process group)."""
    timer = CommTimer()
    ids = [device.index] if device is not None and device.type == "cuda" else None
    ddp = DistributedDataParallel(model, device_ids=ids)
    # INSITU_DDP_COMM_TIMING=0 skips the timing hook (DDP's C++ all-reduce path; comm_s is then 0).
    if os.environ.get("INSITU_DDP_COMM_TIMING", "1") != "0":
        ddp.register_comm_hook(None, timer.hook)
    return ddp, timer


def rank_main(rank: int, world: int, spec: TrainSpec) -> TrainResult | None:
    """One rank's work inside an initialised process group; rank 0 returns the trained state."""
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if dist.get_backend() == "nccl" else None
    x, y = load_split_cached(spec.data.store, spec.data.dataset, spec.data.job_id, spec.data.split)
    rows = rank_rows(len(y), rank, world, spec.seed)
    model = build_model(spec.training.model, spec.n_features)
    model.load_state_dict(spec.state)
    if device is not None:
        model = model.to(device)
    ddp, timer = parallelize(model, device)

    def log_step(m: dict[str, float]) -> None:
        if rank == 0 and int(m["step"]) % 50 == 0:
            log.info("ddp rank0 step %d loss %.4f step %.4fs comm %.4fs", m["step"], m["loss"], m["step_s"],
                     timer.seconds)

    ckpt = Checkpointer(spec.checkpoint) if spec.checkpoint else None
    metrics = train_epochs(ddp, x[rows], y[rows], spec.training, spec.pos_weight, spec.seed, world,
                           comm_seconds=lambda: timer.seconds, on_step=log_step, checkpointer=ckpt)
    metrics["ranks"] = float(world)
    n_total = torch.tensor([len(rows)], dtype=torch.long, device=device)
    dist.all_reduce(n_total)
    if rank != 0:
        return None
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return TrainResult(state, int(n_total.item()), metrics)
