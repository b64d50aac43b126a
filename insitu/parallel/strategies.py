"""The in-site strategies, by name: the one list the configuration is resolved against.

A strategy is a module of ``insitu/parallel/`` that defines ``STRATEGY``, a :class:`~insitu.parallel.types.Strategy`
(name, whether it runs ranks, ``parallelize``, its options, its mesh, its layout check). Its name is the module's.
Adding one is its file and its test: the list is found by looking for such modules.
"""

from __future__ import annotations

import functools
from pathlib import Path

from insitu.parallel.types import Strategy
from insitu.plugins import module_with, modules_with

# This package, by name and folder: known without importing the package itself.
_PACKAGE = __name__.rpartition(".")[0]
_PATH = [str(Path(__file__).parent)]


@functools.cache
def strategies() -> dict[str, Strategy]:
    """Every strategy, by name (imports every module of ``insitu/parallel``: about 2 s)."""
    return {name: module.STRATEGY for name, module in modules_with(_PACKAGE, _PATH, "STRATEGY").items()
            if isinstance(module.STRATEGY, Strategy)}


def strategy(name: str) -> Strategy:
    """The strategy ``name``. Only its own module is imported: listing them all imports every module of
    ``insitu/parallel`` (checkpointing, pipelining: about 2 s), which every config load would pay; the full
    list is made only to say which names exist when ``name`` is not one.

    Raises
    ------
    ValueError
        For an unknown name (the message lists the known ones).
    """
    module = module_with(_PACKAGE, name, "STRATEGY")
    found = getattr(module, "STRATEGY", None)
    if not isinstance(found, Strategy):
        raise ValueError(f"unknown strategy {name!r}; known: {sorted(strategies())}")
    if found.name != name:
        raise RuntimeError(f"{module.__name__}.STRATEGY is called {found.name!r}: a strategy is named as its file")
    return found
