"""``tabular_mlp``: a multi-layer perceptron over engineered tabular features (any task, any width)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def tabular_mlp(n_features: int, n_outputs: int, hidden: Sequence[int] = (64, 32), dropout: float = 0.1) -> nn.Module:
    """Linear → ReLU → Dropout for each hidden width, then a linear layer to ``n_outputs``."""
    layers: list[nn.Module] = []
    width = n_features
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(dropout)]
        width = h
    layers.append(nn.Linear(width, n_outputs))
    return nn.Sequential(*layers)
