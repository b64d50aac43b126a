"""Strategy ``ddp``: synchronous data parallelism with ``DistributedDataParallel``.

Every rank holds the whole model, trains on its part of the site's rows and all-reduces gradients
(ring all-reduce via the backend: gloo on CPU, nccl on CUDA). Communication time is measured with a
comm hook that wraps the default all-reduce.
"""

# No `from __future__ import annotations`: DDP checks the comm hook's annotations at runtime.

import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.parallel import DistributedDataParallel

from insitu.parallel.types import Parallelized, Strategy, TrainSpec


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


def parallelize(model: nn.Module, mesh: DeviceMesh | None, spec: TrainSpec) -> Parallelized:
    """Wrap ``model`` in DDP over ``mesh`` (1-D: every rank of the site) with a timing comm hook."""
    if mesh is None:
        raise ValueError("strategy 'ddp' needs a device mesh over the site's ranks (an initialised process group)")
    timer = CommTimer()
    device = next(model.parameters()).device
    ids = [device.index] if device.type == "cuda" else None
    # forward_sync_buffers=False: the model's only buffers are the global normalisation (mean/std), set
    # identically on every rank from the round's weights and never changed by training; broadcasting
    # them before every forward would add one collective per step.
    ddp = DistributedDataParallel(model, device_ids=ids, device_mesh=mesh, forward_sync_buffers=False)
    # INSITU_DDP_COMM_TIMING=0 skips the timing hook (DDP's C++ all-reduce path; comm_s is then 0).
    if os.environ.get("INSITU_DDP_COMM_TIMING", "1") != "0":
        ddp.register_comm_hook(mesh.get_group(), timer.hook)
    return Parallelized(ddp, lambda: timer.seconds)


STRATEGY = Strategy("ddp", distributed=True, parallelize=parallelize)
