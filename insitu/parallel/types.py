"""What an in-site training strategy receives and returns. Plain data: it travels to Dask workers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from insitu.config import TrainingConfig
from insitu.storage import Store

if TYPE_CHECKING:
    import torch


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
    """One local training job: the model to start from, the data, and how to train."""

    training: TrainingConfig
    n_features: int
    state: dict[str, torch.Tensor]
    data: DataRef
    pos_weight: float
    seed: int
    checkpoint: CheckpointRef | None = None


@dataclass
class TrainResult:
    state: dict[str, torch.Tensor]
    n_samples: int
    metrics: dict[str, float] = field(default_factory=dict)
