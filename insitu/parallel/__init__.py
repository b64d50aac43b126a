"""In-region training. An in-site strategy is one module (``strategies.py`` lists them); ``site.train_site``
launches it.

A strategy that is not ``distributed`` (``single``) runs in this process; one that is (``ddp``) runs
``ranks_per_site`` ranks on the site's Dask workers (``launch.py``), and also under plain ``torchrun``
(``python -m insitu.parallel.run``). Every rank runs :func:`insitu.parallel.rank.rank_main`.

This package's ``__init__`` holds only the types, so that resolving a strategy by name imports that one module.
"""

from __future__ import annotations

from insitu.parallel.types import CheckpointRef, DataRef, TrainResult, TrainSpec

__all__ = ["CheckpointRef", "DataRef", "TrainResult", "TrainSpec"]
