"""Strategy ``single``: one process trains on all of the site's rows; the model is used as built."""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from insitu.parallel.types import Parallelized, TrainSpec

DISTRIBUTED = False  # runs in the calling process, no ranks on Dask


def parallelize(model: nn.Module, mesh: DeviceMesh | None, spec: TrainSpec) -> Parallelized:
    return Parallelized(model)
