"""What every in-site training strategy returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class TrainResult:
    state: dict[str, torch.Tensor]
    n_samples: int
    metrics: dict[str, float] = field(default_factory=dict)
