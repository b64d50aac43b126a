"""In-region training. A strategy is one module with ``train(model, x, y, cfg, pos_weight, seed)``.

``single`` (one process) is here now; ``ddp``, ``fsdp``, ``pipeline``, ``hybrid`` and ``async`` plug in
through the same entry point, launched on the site's Dask workers by ``launch.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from torch import nn

from insitu.config import TrainingConfig
from insitu.parallel import single
from insitu.parallel.types import TrainResult

STRATEGIES: dict[str, Callable[..., TrainResult]] = {"single": single.train}


def train_site(
    model: nn.Module, x: np.ndarray, y: np.ndarray, cfg: TrainingConfig, pos_weight: float, seed: int
) -> TrainResult:
    """Run the configured strategy on this site's training data."""
    try:
        strategy = STRATEGIES[cfg.strategy]
    except KeyError:
        raise ValueError(f"strategy {cfg.strategy!r} is not available; have {sorted(STRATEGIES)}") from None
    return strategy(model, x, y, cfg, pos_weight, seed)
