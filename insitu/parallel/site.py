"""Train on one site: the configured in-site strategy in this process, or its ranks on the site's Dask workers."""

from __future__ import annotations

from insitu.parallel.launch import launch_on_dask
from insitu.parallel.rank import rank_main
from insitu.parallel.strategies import strategy
from insitu.parallel.types import TrainResult, TrainSpec


def train_site(spec: TrainSpec, dask_address: str | None = None) -> TrainResult:
    """Run the configured strategy on this site's training data."""
    if not strategy(spec.training.strategy).distributed:
        result = rank_main(0, 1, spec)
        if result is None:  # rank 0 always returns its result
            raise RuntimeError("rank 0 returned no result")
        return result
    if not dask_address:
        raise ValueError(f"strategy {spec.training.strategy!r} needs the site's Dask scheduler address")
    results = launch_on_dask(dask_address, rank_main, spec.training.ranks_per_site, spec)
    return next(r for r in results if r is not None)
