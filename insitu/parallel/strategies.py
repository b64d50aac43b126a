"""The in-site strategies, by name: the one list the configuration validates against.

A strategy is a module of ``insitu/parallel/`` with ``parallelize(model, mesh, spec) -> Parallelized`` and
``DISTRIBUTED`` (True: it runs ``ranks_per_site`` ranks on the site's Dask workers or under torchrun;
False: in the calling process); its name is the module's. Adding one is its file and its test: the list is
found by looking for such modules.
"""

from __future__ import annotations

import functools
from types import ModuleType


@functools.cache
def strategies() -> dict[str, ModuleType]:
    import insitu.parallel
    from insitu.plugins import modules_with

    return modules_with("insitu.parallel", insitu.parallel.__path__, "parallelize", "DISTRIBUTED")


def strategy_module(name: str) -> ModuleType:
    found = strategies()
    if name not in found:
        raise ValueError(f"strategy {name!r} is not available; have {sorted(found)}")
    return found[name]
