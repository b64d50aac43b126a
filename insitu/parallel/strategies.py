"""The in-site strategies, by name: the one list the configuration is resolved against.

A strategy is a module of ``insitu/parallel/`` with ``parallelize(model, mesh, spec) -> Parallelized`` and
``DISTRIBUTED`` (True: it runs ``ranks_per_site`` ranks on the site's Dask workers or under torchrun;
False: in the calling process), and optionally ``mesh_dims(world, training)`` (its device mesh; default: every
rank data-parallel) and ``check_config(training)`` (its layout fits the ranks and the batch). Its name is the
module's. Adding one is its file and its test: the list is found by looking for such modules.
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType

from insitu.plugins import module_with, modules_with

ATTRIBUTES = ("parallelize", "DISTRIBUTED")  # what makes a module of insitu/parallel a strategy
# This package, by name and folder: known without importing the package itself (which imports this module).
_PACKAGE = __name__.rpartition(".")[0]
_PATH = [str(Path(__file__).parent)]


@functools.cache
def strategies() -> dict[str, ModuleType]:
    """Every strategy, by name (imports every module of ``insitu/parallel``: about 2 s)."""
    return modules_with(_PACKAGE, _PATH, *ATTRIBUTES)


def strategy_module(name: str) -> ModuleType:
    """The strategy ``name``. Only its own module is imported: listing them all imports every module of
    ``insitu/parallel`` (checkpointing, pipelining: about 2 s), which every config load would pay; the full
    list is made only to say which names exist when ``name`` is not one."""
    module = module_with(_PACKAGE, name, *ATTRIBUTES)
    if module is None:
        raise ValueError(f"unknown strategy {name!r}; known: {sorted(strategies())}")
    return module
