"""One rank's work, whatever the strategy: read this rank's rows, build the model, let the strategy
parallelize it, train, and hand back the trained state from rank 0.

A strategy only decides how the model is wrapped (``parallelize(model, mesh, spec)``); data, loss,
optimizer, checkpoints and the loop are the same for all of them, so a new strategy is one file.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from insitu.data.loader import load_rank_part_cached
from insitu.models import build_model
from insitu.parallel.checkpoint import Checkpointer
from insitu.parallel.loop import train_epochs
from insitu.parallel.strategies import strategy_module
from insitu.parallel.types import TrainResult, TrainSpec

log = logging.getLogger(__name__)


def rank_main(rank: int, world: int, spec: TrainSpec) -> TrainResult | None:
    """Train this rank's part; rank 0 returns the result. In a process group when ``world > 1``."""
    strategy = strategy_module(spec.training.strategy)
    distributed = dist.is_available() and dist.is_initialized()
    nccl = distributed and dist.get_backend() == "nccl"
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if nccl else torch.device("cpu")
    # This rank's block of the site's split: it reads only the row groups that hold its rows.
    part = load_rank_part_cached(spec.data.store, spec.data.dataset, spec.data.job_id, spec.data.split, rank, world)
    model = build_model(spec.training.model, spec.n_features, spec.task.n_outputs)
    model.load_state_dict(spec.state)
    model = model.to(device)
    mesh: DeviceMesh | None = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",)) if distributed else None
    wrapped = strategy.parallelize(model, mesh, spec)

    def log_step(m: dict[str, float]) -> None:
        if rank == 0 and int(m["step"]) % 50 == 0:
            log.info("%s rank0 step %d loss %.4f step %.4fs comm %.4fs", spec.training.strategy, m["step"], m["loss"],
                     m["step_s"], wrapped.comm_seconds())

    ckpt = Checkpointer(spec.checkpoint) if spec.checkpoint else None
    proximal = (spec.state, spec.site_options["proximal_mu"]) if spec.site_options.get("proximal_mu") else None
    metrics = train_epochs(wrapped.module, part.x, part.y, spec.training, spec.task.loss(spec.loss_params, device),
                           spec.seed, world, comm_seconds=wrapped.comm_seconds, on_step=log_step, checkpointer=ckpt,
                           proximal=proximal)
    metrics["ranks"] = float(world)
    if rank != 0:
        return None
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    # Every rank trained on a block of the same size (load_rank_part), so no collective is needed to count.
    return TrainResult(state, len(part.y) * world, metrics)
