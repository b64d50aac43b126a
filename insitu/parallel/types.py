"""What an in-site training strategy receives and returns. Plain data: it travels to Dask workers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict
from torch import nn

from insitu.conf import TrainingConfig
from insitu.storage import Store

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    from insitu.specs.base import TaskSpec


@dataclass
class DataRef:
    """Where a site's prepared split lives (each rank loads its own part from there)."""

    store: Store
    dataset: str
    job_id: str
    split: str = "train"


@dataclass
class CheckpointRef:
    """Where one round's checkpoints go, and how often (0 = at the end of every epoch only)."""

    store: Store
    prefix: str
    every_steps: int = 0


@dataclass
class TrainSpec:
    """One local training job: the model to start from, the data, and how to train.

    ``loss_params`` come from the job's global statistics (e.g. class weights), ``site_options`` from the
    aggregator's configure hook (e.g. FedProx's ``proximal_mu``).
    """

    training: TrainingConfig
    task: TaskSpec
    n_features: int
    state: dict[str, torch.Tensor]
    data: DataRef
    loss_params: dict[str, Any]
    seed: int
    checkpoint: CheckpointRef | None = None
    site_options: dict[str, float] = field(default_factory=dict)


@dataclass
class TrainResult:
    state: dict[str, torch.Tensor]
    n_samples: int
    metrics: dict[str, float] = field(default_factory=dict)


# One training step on a batch: forward and backward, gradients left in the parameters. Returns the batch's
# mean loss on a rank that computes it (a pipeline's last stage), None on one that does not.
StepFn = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor | None"]


@dataclass
class Parallelized:
    """What a strategy's ``parallelize(model, mesh, spec)`` returns.

    ``module`` is what this rank's optimizer steps (the wrapped model, or a pipeline stage), ``comm_seconds`` a
    clock of the seconds its collectives took (0 where they are not timed), ``step`` its own forward and
    backward (None: ``loss_fn(module(x), y).backward()``), ``full_state`` a collective that returns the whole
    model's state dict on global rank 0 (None: gathered from ``module``), and ``drop_last`` whether a batch
    smaller than the others is skipped (a pipeline's micro-batch shapes are fixed at the first step).
    """

    module: nn.Module
    comm_seconds: Callable[[], float] = lambda: 0.0
    step: StepFn | None = None
    full_state: Callable[[], dict[str, torch.Tensor]] | None = None
    drop_last: bool = False


class NoOptions(BaseModel):
    """A strategy's options (its sections of ``parallel:``) when it takes none. Other strategies' sections are
    left to them: a config may switch strategy without deleting the sections it no longer uses."""

    model_config = ConfigDict(extra="ignore", frozen=True)


@dataclass(frozen=True)
class Strategy:
    """An in-site strategy, one per file of ``insitu/parallel/`` as ``STRATEGY = Strategy(...)``.

    ``distributed``: True runs ``ranks_per_site`` ranks on the site's Dask workers (or under torchrun), False runs
    in the calling process. ``parallelize(model, mesh, spec)`` returns what trains. ``options`` validates the
    strategy's sections of ``parallel:`` (:meth:`options_of`). ``mesh_dims(world, training)`` lays out the device
    mesh, outermost dimension first (None: every rank data-parallel, ``{"dp": world}``). ``check(training)``
    raises ValueError when the layout cannot work with these ranks and batch, naming the key and the fix.
    """

    name: str
    distributed: bool
    parallelize: Callable[[nn.Module, DeviceMesh | None, TrainSpec], Parallelized]
    options: type[BaseModel] = NoOptions
    mesh_dims: Callable[[int, TrainingConfig], dict[str, int]] | None = None
    check: Callable[[TrainingConfig], None] | None = None

    def options_of(self, training: TrainingConfig) -> BaseModel:
        """This strategy's options, from the training config's ``parallel:`` mapping."""
        return self.options.model_validate(training.parallel)
