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
    """The strategy ``name``. Only its own module is imported: listing them all imports every module of
    ``insitu/parallel`` (checkpointing, pipelining: about 2 s), which every config load would pay; the full
    list is made only to say which names exist when ``name`` is not one."""
    import importlib
    import importlib.util

    if name.isidentifier() and importlib.util.find_spec(f"insitu.parallel.{name}") is not None:
        module = importlib.import_module(f"insitu.parallel.{name}")
        if hasattr(module, "parallelize") and hasattr(module, "DISTRIBUTED"):
            return module
    raise ValueError(f"strategy {name!r} is not available; have {sorted(strategies())}")
