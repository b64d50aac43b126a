"""Strategy ``hybrid``: a 2-D device mesh, ``parallel.mesh`` (outermost dimension first).

- ``{pp: P, dp_shard: S}``: P pipeline stages, each stage sharded with FSDP over S ranks (pipeline × data
  parallel: the S replicas of the pipeline read different rows);
- ``{dp_replicate: R, dp_shard: S}``: HSDP, FSDP within groups of S ranks and replicas across the R groups
  (gradients reduce-scattered within a group, then all-reduced across groups);
- all three: pipeline × HSDP.

The sizes multiply to ``ranks_per_site``. Ranks of one data-parallel replica read the same rows; the replicas
read different blocks of the site's split, as under DDP.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from insitu.conf import TrainingConfig
from insitu.models import Standardized
from insitu.parallel.fsdp import FsdpOptions, apply_fsdp
from insitu.parallel.pipeline import PipelineOptions, build_pipeline, check_pipeline
from insitu.parallel.types import Parallelized, Strategy, TrainSpec

MESH_DIMS = ("pp", "dp_replicate", "dp_shard")  # outermost first


class Options(BaseModel):
    """``parallel.mesh`` (the device mesh's shape) and the options of the parallelisms it composes."""

    model_config = ConfigDict(extra="ignore", frozen=True)  # other strategies' sections are theirs
    mesh: dict[str, Annotated[int, Field(ge=1)]] = Field(
        default_factory=dict, description="the device mesh's shape, e.g. {pp: 2, dp_shard: 2} (pipeline × FSDP) "
        "or {dp_replicate: 2, dp_shard: 2} (HSDP); the sizes multiply to ranks_per_site")
    fsdp: FsdpOptions = FsdpOptions()
    pipeline: PipelineOptions = PipelineOptions()

    @field_validator("mesh")
    @classmethod
    def _dims(cls, v: dict[str, int]) -> dict[str, int]:
        unknown = sorted(set(v) - set(MESH_DIMS))
        if unknown:
            raise ValueError(f"unknown mesh dimension(s) {unknown}; known: {list(MESH_DIMS)}")
        return {d: v[d] for d in MESH_DIMS if d in v}  # one order, whatever the file's


def mesh_dims(world: int, training: TrainingConfig) -> dict[str, int]:
    return dict(Options.model_validate(training.parallel).mesh)


def check_config(training: TrainingConfig) -> None:
    options = Options.model_validate(training.parallel)
    mesh = options.mesh
    if len(mesh) < 2:
        raise ValueError(f"strategy 'hybrid' needs a 2-D mesh in parallel.mesh, e.g. {{pp: 2, dp_shard: 2}} or "
                         f"{{dp_replicate: 2, dp_shard: 2}}; got {mesh or 'none'} (one dimension: use strategy "
                         "pipeline or fsdp)")
    if math.prod(mesh.values()) != training.ranks_per_site:
        raise ValueError(f"parallel.mesh {mesh} has {math.prod(mesh.values())} ranks but ranks_per_site is "
                         f"{training.ranks_per_site}; make them equal")
    if "dp_replicate" in mesh and "dp_shard" not in mesh:
        raise ValueError("parallel.mesh: dp_replicate needs dp_shard (HSDP replicates sharded groups); for "
                         "pipeline × data parallel use {pp: P, dp_shard: S}")
    if "pp" in mesh:
        replicas = math.prod(v for k, v in mesh.items() if k.startswith("dp"))
        check_pipeline(training, options.pipeline, stages=mesh["pp"], replicas=replicas)


def parallelize(model: nn.Module, mesh: DeviceMesh | None, spec: TrainSpec) -> Parallelized:
    if mesh is None or mesh.mesh_dim_names is None:
        raise ValueError("strategy 'hybrid' needs a named device mesh over the site's ranks")
    names = mesh.mesh_dim_names
    dp_names = tuple(n for n in names if n.startswith("dp"))
    device = next(model.parameters()).device
    fsdp = Options.model_validate(spec.training.parallel).fsdp
    dp_mesh = mesh[dp_names] if dp_names else None
    if "pp" not in names:  # HSDP
        assert dp_mesh is not None
        return Parallelized(apply_fsdp(model, dp_mesh, fsdp, device))
    if not isinstance(model, Standardized):
        raise TypeError("a pipeline splits an insitu model (models.build_model's Standardized)")
    leader = dp_mesh is None or all(c == 0 for c in (dp_mesh.get_coordinate() or []))
    wrap = (lambda stage: apply_fsdp(stage, dp_mesh, fsdp, device)) if dp_mesh is not None else None
    return build_pipeline(model, mesh["pp"], spec, wrap_stage=wrap, is_replica_leader=leader)


STRATEGY = Strategy("hybrid", distributed=True, parallelize=parallelize, options=Options, mesh_dims=mesh_dims,
                    check=check_config)
