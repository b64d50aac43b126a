"""One rank's work, whatever the strategy: lay the ranks out on a device mesh, let the strategy parallelize
the model, read this replica's rows, train, and hand the whole trained state back on rank 0.

A strategy only decides the mesh (``mesh_dims``, default: every rank data-parallel) and how the model is
wrapped or split (``parallelize(model, mesh, spec)``); data, loss, optimizer, checkpoints and the loop are the
same for all of them, so a new strategy is one file.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from insitu.conf import TrainingConfig
from insitu.data.loader import load_rank_part_cached
from insitu.federated.aggregators import AGGREGATORS
from insitu.models import build_model
from insitu.parallel.allocator import training_allocator
from insitu.parallel.checkpoint import Checkpointer
from insitu.parallel.loop import train_epochs
from insitu.parallel.state import local_full_state, named_parameters
from insitu.parallel.strategies import strategy as strategy_named
from insitu.parallel.types import Strategy, TrainResult, TrainSpec

log = logging.getLogger(__name__)


def mesh_dims(strategy: Strategy, world: int, training: TrainingConfig) -> dict[str, int]:
    """The strategy's mesh, outermost dimension first (``{"dp": world}`` unless it says otherwise)."""
    dims = strategy.mesh_dims(world, training) if strategy.mesh_dims is not None else {"dp": world}
    if math.prod(dims.values()) != world:
        raise ValueError(f"strategy {training.strategy!r} lays out {dims} = {math.prod(dims.values())} ranks, "
                         f"but {world} ranks run; make parallel.mesh multiply to ranks_per_site")
    return dims


def data_replica(mesh: DeviceMesh | None) -> tuple[int, int]:
    """This rank's data-parallel replica and the number of replicas: the mesh's ``dp*`` dimensions, flattened.
    Ranks of one replica (the stages of one pipeline) read the same rows."""
    if mesh is None or mesh.mesh_dim_names is None:
        return 0, 1
    index, size = 0, 1
    for name, coord in zip(mesh.mesh_dim_names, mesh.get_coordinate() or [], strict=True):
        if name.startswith("dp"):
            n = mesh.size(mesh.mesh_dim_names.index(name))
            index, size = index * n + coord, size * n
    return index, size


def rank_main(rank: int, world: int, spec: TrainSpec) -> TrainResult | None:
    """Train this rank's part; rank 0 returns the result. In a process group when ``world > 1``.

    On a Dask worker the allocator is tuned for training while it runs (:mod:`insitu.parallel.allocator`).
    """
    with training_allocator():
        return _rank_main(rank, world, spec)


def _rank_main(rank: int, world: int, spec: TrainSpec) -> TrainResult | None:
    strategy = strategy_named(spec.training.strategy)
    distributed = dist.is_available() and dist.is_initialized()
    nccl = distributed and dist.get_backend() == "nccl"
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if nccl else torch.device("cpu")
    model = build_model(spec.training.model, spec.n_features, spec.task.n_outputs)
    model.load_state_dict(spec.state)
    model = model.to(device)
    mesh: DeviceMesh | None = None
    if distributed:
        dims = mesh_dims(strategy, world, spec.training)
        mesh = init_device_mesh(device.type, tuple(dims.values()), mesh_dim_names=tuple(dims))
    wrapped = strategy.parallelize(model, mesh, spec)
    replica, replicas = data_replica(mesh)
    # This replica's block of the site's split: it reads only the row groups that hold its rows.
    part = load_rank_part_cached(spec.data.store, spec.data.dataset, spec.data.job_id, spec.data.split, replica,
                                 replicas)

    def log_step(m: dict[str, Any]) -> None:
        if rank == 0 and int(m["step"]) % 50 == 0:
            log.info("%s rank0 step %d loss %.4f step %.4fs comm %.4fs", spec.training.strategy, m["step"],
                     float(m["loss"]), m["step_s"], wrapped.comm_seconds())

    ckpt = Checkpointer(spec.checkpoint) if spec.checkpoint else None
    # The aggregator's part on the site (FedProx's proximal term), against this rank's parameters (whole, shard or
    # stage) by their names, with the round's global weights as the reference.
    hook = AGGREGATORS[spec.training.aggregator.name].site_gradient_hook(
        named_parameters(wrapped.module), spec.state, spec.site_options)
    metrics = train_epochs(wrapped.module, part.x, part.y, spec.training, spec.task.loss(spec.loss_params, device),
                           spec.seed, replicas, comm_seconds=wrapped.comm_seconds, on_step=log_step, checkpointer=ckpt,
                           after_backward=hook, step=wrapped.step, drop_last=wrapped.drop_last)
    loss_sum, loss_rows = metrics.pop("loss_sum"), metrics.pop("loss_rows")  # not reported: only the mean is
    if distributed:  # the loss over every row trained, wherever it was computed (a pipeline: its last stages)
        totals = torch.tensor([loss_sum, loss_rows], dtype=torch.float64, device=device)
        dist.all_reduce(totals)
        metrics["train_loss"] = float(totals[0] / totals[1]) if totals[1] > 0 else float("nan")
    metrics["ranks"] = float(world)
    metrics["replicas"] = float(replicas)
    state = wrapped.full_state() if wrapped.full_state is not None else local_full_state(wrapped.module)
    if rank != 0:
        return None
    # Every replica trained on a block of the same size (load_rank_part), so no collective is needed to count.
    return TrainResult(state, len(part.y) * replicas, metrics)
