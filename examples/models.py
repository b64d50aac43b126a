"""A user's own model, as insitu takes it: a factory named by import path in a training config::

    model: {name: "examples.models:residual_mlp", options: {width: 64, blocks: 2}}

The contract (see ``insitu/models/__init__.py``): ``make(n_features, n_outputs, **options) -> nn.Module``,
taking standardised features ``(batch, n_features)`` and returning ``(batch, n_outputs)``. insitu adds the
feature normalisation and output scaling around it, so this file knows nothing of insitu. The module must be
importable wherever the sites and the coordinator run (here: the checkout they run from).
"""

from __future__ import annotations

import torch
from torch import nn


class ResidualBlock(nn.Module):
    def __init__(self, width: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Dropout(dropout), nn.Linear(width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(self.norm(x))


class ResidualMLP(nn.Module):
    """Linear stem, ``blocks`` pre-norm residual blocks, linear head."""

    def __init__(self, n_features: int, n_outputs: int, width: int, blocks: int, dropout: float) -> None:
        super().__init__()
        self.stem = nn.Linear(n_features, width)
        self.blocks = nn.Sequential(*(ResidualBlock(width, dropout) for _ in range(blocks)))
        self.head = nn.Linear(width, n_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


def residual_mlp(n_features: int, n_outputs: int, width: int = 64, blocks: int = 2,
                 dropout: float = 0.0) -> nn.Module:
    return ResidualMLP(n_features, n_outputs, width, blocks, dropout)
