"""An in-site strategy in one file: one process, counting how often it wrapped a model."""

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from insitu.parallel.types import Parallelized, Strategy, TrainSpec

CALLS = 0


def parallelize(model: nn.Module, mesh: DeviceMesh | None, spec: TrainSpec) -> Parallelized:
    global CALLS
    CALLS += 1
    return Parallelized(model)


STRATEGY = Strategy("dummy_single", distributed=False, parallelize=parallelize)
