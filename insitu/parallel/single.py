"""Strategy ``single``: one process trains on the whole of the site's data.

The in-site distributed strategies (ddp, fsdp, …) implement the same :func:`train` signature.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from insitu.config import TrainingConfig
from insitu.parallel.types import TrainResult


def make_optimizer(model: nn.Module, cfg: TrainingConfig) -> torch.optim.Optimizer:
    o = cfg.optimizer
    if o.name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
    if o.name == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=o.lr, weight_decay=o.weight_decay)
    return torch.optim.Adam(model.parameters(), lr=o.lr, weight_decay=o.weight_decay)


def train(
    model: nn.Module, x: np.ndarray, y: np.ndarray, cfg: TrainingConfig, pos_weight: float, seed: int
) -> TrainResult:
    """Train ``model`` in place for ``cfg.local_epochs`` epochs; returns its state and metrics."""
    torch.manual_seed(seed)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    opt = make_optimizer(model, cfg)
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(pos_weight))
    gen = torch.Generator().manual_seed(seed)
    model.train()
    steps, total_loss, seen = 0, 0.0, 0
    t0 = time.perf_counter()
    for _ in range(cfg.local_epochs):
        order = torch.randperm(len(xt), generator=gen)
        for i in range(0, len(order), cfg.batch_size):
            idx = order[i : i + cfg.batch_size]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            steps += 1
            total_loss += float(loss) * len(idx)
            seen += len(idx)
    elapsed = time.perf_counter() - t0
    return TrainResult(
        state={k: v.detach().clone() for k, v in model.state_dict().items()},
        n_samples=len(xt),
        metrics={
            "train_loss": total_loss / max(seen, 1),
            "steps": float(steps),
            "samples_per_s": seen / elapsed if elapsed > 0 else 0.0,
            "train_seconds": elapsed,
        },
    )
