"""In-region training. A strategy is one module; ``train_site`` picks and launches it.

``single`` runs in this process; ``ddp`` runs ``ranks_per_site`` ranks on the site's Dask workers
(``launch.py``) and also runs under plain ``torchrun`` (``python -m insitu.parallel.run``).
"""

from __future__ import annotations

from insitu.parallel.types import CheckpointRef, DataRef, TrainResult, TrainSpec

__all__ = ["CheckpointRef", "DataRef", "TrainResult", "TrainSpec", "train_site"]


def train_site(spec: TrainSpec, dask_address: str | None = None) -> TrainResult:
    """Run the configured strategy on this site's training data."""
    strategy = spec.training.strategy
    if strategy == "single":
        from insitu.parallel import single

        return single.train(spec)
    if strategy == "ddp":
        from insitu.parallel import ddp
        from insitu.parallel.launch import launch_on_dask

        if not dask_address:
            raise ValueError("strategy 'ddp' needs the site's Dask scheduler address")
        results = launch_on_dask(dask_address, ddp.rank_main, spec.training.ranks_per_site, spec)
        return next(r for r in results if r is not None)
    raise ValueError(f"strategy {strategy!r} is not available; have ['single', 'ddp']")
