"""Strategy ``pipeline``: model parallelism with ``torch.distributed.pipelining``.

The model's blocks are split into ``ranks_per_site`` stages, one per rank: stage 0 reads the features and
sends activations to stage 1, and so on; the last stage computes the loss and the gradients flow back. Each
step's batch is cut into ``parallel.pipeline.microbatches`` micro-batches so that stages work at the same time,
in the GPipe order (all forwards, then all backwards) or 1F1B (one forward, one backward: fewer activations
alive). Gradients are averaged over the micro-batches, so a step equals one step on the whole batch.

How a model splits: a core with ``layers`` and ``pipeline_stage(lo, hi, first, last)`` (the built-in
``sequence_transformer``) keeps its blocks ``lo..hi-1`` and drops the embedding or head it does not need; an
``nn.Sequential`` core (``tabular_mlp``) keeps a range of its children. Names never change, so every stage's
state-dict keys are the whole model's and the stages' state dicts add up to it (checkpoints, the update).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Annotated, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from insitu.conf import TrainingConfig
from insitu.models import Standardized
from insitu.parallel.state import gather_stage_states, local_full_state
from insitu.parallel.types import Parallelized, Strategy, TrainSpec

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


class PipelineOptions(BaseModel):
    """``parallel.pipeline``: ``torch.distributed.pipelining`` options (strategy ``pipeline``, and the pipeline part
    of ``hybrid``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    schedule: Literal["gpipe", "1f1b"] = Field("1f1b", description="GPipe (all forwards, then all backwards) or "
                                               "1F1B (interleaved: fewer activations alive at once)")
    microbatches: Annotated[int, Field(ge=1, le=4096)] = Field(
        4, description="micro-batches per step; the per-replica batch must be a multiple of it")
    split_points: list[Annotated[int, Field(ge=1)]] | None = Field(
        None, description="the block index where each stage after the first begins (one per extra stage); "
                          "empty: blocks split evenly")


class Options(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)  # other strategies' sections are theirs
    pipeline: PipelineOptions = PipelineOptions()


def mesh_dims(world: int, training: TrainingConfig) -> dict[str, int]:
    return {"pp": world}


def check_config(training: TrainingConfig) -> None:
    if training.ranks_per_site < 2:
        raise ValueError("strategy 'pipeline' splits the model over ranks_per_site ranks: set ranks_per_site >= 2")
    check_pipeline(training, Options.model_validate(training.parallel).pipeline, stages=training.ranks_per_site,
                   replicas=1)


def check_pipeline(training: TrainingConfig, pp: PipelineOptions, stages: int, replicas: int) -> None:
    """The batch splits into equal micro-batches, and the split points name one boundary per extra stage."""
    per_replica = training.batch_size // replicas
    if per_replica % pp.microbatches:
        raise ValueError(f"parallel.pipeline.microbatches ({pp.microbatches}) must divide the batch of each "
                         f"data-parallel replica (batch_size {training.batch_size} / {replicas} = {per_replica}); "
                         "change batch_size or microbatches")
    if pp.split_points is not None and len(pp.split_points) != stages - 1:
        raise ValueError(f"parallel.pipeline.split_points has {len(pp.split_points)} entries; {stages} stages need "
                         f"{stages - 1} (the block where each stage after the first begins), or leave it empty")


def stage_bounds(n_blocks: int, n_stages: int, split_points: list[int] | None) -> list[int]:
    """Block boundaries ``[0, s1, …, n_blocks]``: stage i holds blocks ``bounds[i]`` to ``bounds[i+1] - 1``."""
    if split_points is None:
        if n_blocks < n_stages:
            raise ValueError(f"the model has {n_blocks} blocks, fewer than the {n_stages} pipeline stages; use fewer "
                             "ranks or a deeper model")
        return [round(i * n_blocks / n_stages) for i in range(n_stages + 1)]
    bounds = [0, *split_points, n_blocks]
    if len(bounds) != n_stages + 1 or any(a >= b for a, b in zip(bounds, bounds[1:], strict=False)):
        raise ValueError(f"parallel.pipeline.split_points {split_points} do not cut {n_blocks} blocks into "
                         f"{n_stages} non-empty stages: give {n_stages - 1} increasing block indices below {n_blocks}")
    return bounds


def stage_module(model: Standardized, stage: int, n_stages: int, split_points: list[int] | None) -> Standardized:
    """A copy of ``model`` holding only stage ``stage``'s part (``model`` itself is left whole)."""
    first, last = stage == 0, stage == n_stages - 1
    part = copy.deepcopy(model)
    core = part.core
    if hasattr(core, "pipeline_stage") and hasattr(core, "layers"):
        bounds = stage_bounds(len(core.layers), n_stages, split_points)
        core.pipeline_stage(bounds[stage], bounds[stage + 1], first, last)
    elif isinstance(core, nn.Sequential):
        bounds = stage_bounds(len(core), n_stages, split_points)
        for i in range(len(core)):
            if not bounds[stage] <= i < bounds[stage + 1]:
                core[i] = nn.Identity()  # a placeholder keeps the other children's indices (their names)
    else:
        raise ValueError(f"{type(core).__name__} cannot be split into pipeline stages: give its core `layers` and "
                         "`pipeline_stage(lo, hi, first, last)` (see sequence_transformer) or make it an "
                         "nn.Sequential")
    part.first_stage, part.last_stage = first, last
    return part


def build_pipeline(model: Standardized, pp_mesh: DeviceMesh, spec: TrainSpec,
                   wrap_stage: Callable[[nn.Module], nn.Module] | None = None,
                   is_replica_leader: bool = True) -> Parallelized:
    """This rank's stage of ``model`` over ``pp_mesh`` (optionally sharded further by ``wrap_stage``), with the
    configured schedule as its step. ``is_replica_leader``: this rank sends its stage's weights to rank 0."""
    pp = Options.model_validate(spec.training.parallel).pipeline
    n_stages, stage = pp_mesh.size(), pp_mesh.get_local_rank()
    device = next(model.parameters()).device
    module: nn.Module = stage_module(model, stage, n_stages, pp.split_points)
    if wrap_stage is not None:
        module = wrap_stage(module)
    pipe = PipelineStage(module, stage, n_stages, device, group=pp_mesh.get_group())
    loss_fn = spec.task.loss(spec.loss_params, device)
    schedule = SCHEDULES[pp.schedule](pipe, n_microbatches=pp.microbatches, loss_fn=loss_fn)
    first, last = stage == 0, stage == n_stages - 1

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        losses: list[torch.Tensor] = []
        if first:
            schedule.step(x)
        elif last:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        # Equal micro-batches: the mean of their mean losses is the batch's mean loss.
        return torch.stack([loss.detach() for loss in losses]).mean() if last else None

    return Parallelized(module, step=step, drop_last=True,
                        full_state=lambda: gather_stage_states(local_full_state(module), is_replica_leader))


def parallelize(model: nn.Module, mesh: DeviceMesh | None, spec: TrainSpec) -> Parallelized:
    if mesh is None:
        raise ValueError("strategy 'pipeline' needs a device mesh over the site's ranks (an initialised process group)")
    if not isinstance(model, Standardized):
        raise TypeError("a pipeline splits an insitu model (models.build_model's Standardized)")
    return build_pipeline(model, mesh, spec)


STRATEGY = Strategy("pipeline", distributed=True, parallelize=parallelize, options=Options, mesh_dims=mesh_dims,
                    check=check_config)
