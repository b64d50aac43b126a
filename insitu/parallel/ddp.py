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
from torch.nn.parallel import DistributedDataParallel

from insitu.data.loader import load_rank_part_cached
from insitu.models.fraud_mlp import build_model
from insitu.parallel.checkpoint import Checkpointer
from insitu.parallel.loop import train_epochs
from insitu.parallel.types import TrainResult, TrainSpec

log = logging.getLogger(__name__)


class CommTimer:
    """Wall time from launching each bucket's all-reduce until its result is ready.

    The hook is DDP's default all-reduce (average the bucket, ``all_reduce`` it) with the clock read in
    its one completion callback: no cost on top of the default hook's own callback.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def hook(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        group = state if state is not None else dist.group.WORLD
        t0 = time.perf_counter()
        tensor = bucket.buffer().div_(group.size())

        def done(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            self.seconds += time.perf_counter() - t0
            self.calls += 1
            return f.value()[0]

        return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(done)


def parallelize(model: nn.Module, device: torch.device | None = None) -> tuple[nn.Module, CommTimer]:
    """Wrap ``model`` in DDP with a timing comm hook (needs an initialised process group)."""
    timer = CommTimer()
    ids = [device.index] if device is not None and device.type == "cuda" else None
    # forward_sync_buffers=False: the model's only buffers are the global normalisation (mean/std), set
    # identically on every rank from the round's weights and never changed by training; broadcasting
    # them before every forward would add one collective per step.
    ddp = DistributedDataParallel(model, device_ids=ids, forward_sync_buffers=False)
    # INSITU_DDP_COMM_TIMING=0 skips the timing hook (DDP's C++ all-reduce path; comm_s is then 0).
    if os.environ.get("INSITU_DDP_COMM_TIMING", "1") != "0":
        ddp.register_comm_hook(None, timer.hook)
    return ddp, timer


def rank_main(rank: int, world: int, spec: TrainSpec) -> TrainResult | None:
    """One rank's work inside an initialised process group; rank 0 returns the trained state."""
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if dist.get_backend() == "nccl" else None
    # This rank's block of the site's split: it reads only the row groups that hold its rows.
    part = load_rank_part_cached(spec.data.store, spec.data.dataset, spec.data.job_id, spec.data.split, rank, world)
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
    metrics = train_epochs(ddp, part.x, part.y, spec.training, spec.pos_weight, spec.seed, world,
                           comm_seconds=lambda: timer.seconds, on_step=log_step, checkpointer=ckpt)
    metrics["ranks"] = float(world)
    if rank != 0:
        return None
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    # Every rank trained on a block of the same size (load_rank_part), so no collective is needed to count.
    return TrainResult(state, len(part.y) * world, metrics)
