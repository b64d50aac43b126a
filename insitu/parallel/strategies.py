"""The in-site strategies, by name: the one list the configuration validates against.

A strategy is a module of ``insitu/parallel/`` with ``parallelize(model, mesh, spec) -> Parallelized`` and
``DISTRIBUTED`` (True: it runs ``ranks_per_site`` ranks on the site's Dask workers or under torchrun;
False: in the calling process); its name is the module's. Adding one is its file and its test: the list is
found by looking for such modules.
"""

from __future__ import annotations

import functools
from types import ModuleType

ATTRIBUTES = ("parallelize", "DISTRIBUTED")  # what makes a module of insitu/parallel a strategy


@functools.cache
def strategies() -> dict[str, ModuleType]:
    import insitu.parallel
    from insitu.plugins import modules_with

    return modules_with("insitu.parallel", insitu.parallel.__path__, *ATTRIBUTES)


def strategy_module(name: str) -> ModuleType:
    """The strategy ``name``. Only its own module is imported: listing them all imports every module of
    ``insitu/parallel`` (checkpointing, pipelining: about 2 s), which every config load would pay; the full
    list is made only to say which names exist when ``name`` is not one."""
    import insitu.parallel
    from insitu.plugins import module_with

    module = module_with(insitu.parallel.__name__, name, *ATTRIBUTES)
    if module is None:
        raise ValueError(f"unknown strategy {name!r}; known: {sorted(strategies())}")
    return module
