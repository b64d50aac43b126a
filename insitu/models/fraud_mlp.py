"""Tabular fraud classifier: global standardisation, then an MLP that outputs one logit."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from insitu.config import ModelConfig


class FraudMLP(nn.Module):
    """``(batch, features)`` engineered features → ``(batch,)`` fraud logits.

    The global feature mean and std (from federated statistics) are buffers, so the registered
    model takes un-normalised features and carries its own normalisation.
    """

    def __init__(
        self,
        n_features: int,
        hidden: Sequence[int] = (64, 32),
        dropout: float = 0.1,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean if mean is not None else [0.0] * n_features))
        self.register_buffer("std", torch.tensor(std if std is not None else [1.0] * n_features))
        layers: list[nn.Module] = []
        width = n_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(dropout)]
            width = h
        layers.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - self.mean) / self.std).squeeze(-1)


def build_model(
    cfg: ModelConfig, n_features: int, mean: Sequence[float] | None = None, std: Sequence[float] | None = None
) -> nn.Module:
    """Build the configured model; every site and the coordinator build it the same way."""
    if cfg.name == "fraud_mlp":
        return FraudMLP(n_features, cfg.hidden, cfg.dropout, mean, std)
    raise ValueError(f"unknown model {cfg.name!r}")
