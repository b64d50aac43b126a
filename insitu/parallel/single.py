"""Strategy ``single``: one process trains on all of the site's rows; the model is used as built."""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from insitu.parallel.types import Parallelized, Strategy, TrainSpec


def parallelize(model: nn.Module, mesh: DeviceMesh | None, spec: TrainSpec) -> Parallelized:
    return Parallelized(model)


# One process trains on all of the site's rows: no ranks on Dask.
STRATEGY = Strategy("single", distributed=False, parallelize=parallelize)
