"""The in-site strategies, by name: the one list the configuration validates against.

A strategy is a module of ``insitu/parallel/`` with ``parallelize(model, mesh, spec) -> Parallelized`` and
``DISTRIBUTED`` (True: it runs ``ranks_per_site`` ranks on the site's Dask workers or under torchrun;
False: in the calling process). Adding one is its file, its line here, and its test.
"""

from __future__ import annotations

import importlib
from types import ModuleType

STRATEGIES: dict[str, str] = {"single": "insitu.parallel.single", "ddp": "insitu.parallel.ddp"}


def strategy_module(name: str) -> ModuleType:
    if name not in STRATEGIES:
        raise ValueError(f"strategy {name!r} is not available; have {sorted(STRATEGIES)}")
    return importlib.import_module(STRATEGIES[name])
