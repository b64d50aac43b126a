"""In-region training. A strategy is one module (``strategies.py`` lists them); ``train_site`` launches it.

A strategy that is not ``DISTRIBUTED`` (``single``) runs in this process; one that is (``ddp``) runs
``ranks_per_site`` ranks on the site's Dask workers (``launch.py``), and also under plain ``torchrun``
(``python -m insitu.parallel.run``). Every rank runs :func:`insitu.parallel.rank.rank_main`.
"""

from __future__ import annotations

from insitu.parallel.types import CheckpointRef, DataRef, TrainResult, TrainSpec

__all__ = ["CheckpointRef", "DataRef", "TrainResult", "TrainSpec", "train_site"]


def train_site(spec: TrainSpec, dask_address: str | None = None) -> TrainResult:
    """Run the configured strategy on this site's training data."""
    from insitu.parallel.rank import rank_main
    from insitu.parallel.strategies import strategy_module

    strategy = strategy_module(spec.training.strategy)
    if not strategy.DISTRIBUTED:
        result = rank_main(0, 1, spec)
        if result is None:  # rank 0 always returns its result
            raise RuntimeError("rank 0 returned no result")
        return result
    from insitu.parallel.launch import launch_on_dask

    if not dask_address:
        raise ValueError(f"strategy {spec.training.strategy!r} needs the site's Dask scheduler address")
    results = launch_on_dask(dask_address, rank_main, spec.training.ranks_per_site, spec)
    return next(r for r in results if r is not None)
