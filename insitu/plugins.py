"""Find the implementations of a seam (tasks, aggregators, strategies, models) by looking in their package.

Adding a task, an aggregator, a strategy or a built-in model is then one file (and its test): no list to
edit beside it. A module whose name ends in ``_test`` or starts with ``_`` is not an implementation.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import TypeVar

T = TypeVar("T")


def _is_implementation(name: str) -> bool:
    return not name.endswith("_test") and not name.startswith("_")


def modules_of(package: str, path: Iterable[str]) -> list[ModuleType]:
    """The modules of ``package`` (at ``path``, its ``__path__``), imported, in name order."""
    names = sorted(m.name for m in pkgutil.iter_modules(list(path)))
    return [importlib.import_module(f"{package}.{n}") for n in names if _is_implementation(n)]


def named_subclasses(package: str, path: Iterable[str], base: type[T]) -> dict[str, type[T]]:
    """``name`` → class, for each subclass of ``base`` defined in a module of the package that sets its own
    ``name`` (an intermediate base such as FedOpt sets none, and is left out).

    Raises
    ------
    RuntimeError
        When two classes claim one name (the later would silently shadow the other).
    """
    found: dict[str, type[T]] = {}
    for module in modules_of(package, path):
        for obj in vars(module).values():
            if (isinstance(obj, type) and issubclass(obj, base) and obj.__module__ == module.__name__
                    and "name" in obj.__dict__):
                name = obj.__dict__["name"]
                if name in found and found[name] is not obj:
                    raise RuntimeError(f"{found[name].__qualname__} and {obj.__qualname__} are both called {name!r}")
                found[name] = obj
    return found


def modules_with(package: str, path: Iterable[str], *attributes: str) -> dict[str, ModuleType]:
    """Module name → module, for the modules of the package that define every one of ``attributes``."""
    return {m.__name__.rsplit(".", 1)[-1]: m for m in modules_of(package, path)
            if all(hasattr(m, a) for a in attributes)}


def module_with(package: str, name: str, *attributes: str) -> ModuleType | None:
    """The one module ``name`` of the package, imported alone, when :func:`modules_with` would list it (an
    implementation defining every one of ``attributes``); else None. For a lookup by name that should not pay
    for importing every implementation."""
    if not name.isidentifier() or not _is_implementation(name) or \
            importlib.util.find_spec(f"{package}.{name}") is None:
        return None
    module = importlib.import_module(f"{package}.{name}")
    return module if all(hasattr(module, a) for a in attributes) else None


def functions_named_as_their_module(package: str, path: Iterable[str]) -> dict[str, Callable[..., object]]:
    """Module name → the module's function of the same name (``tabular_mlp.py`` → ``tabular_mlp``)."""
    return {name: getattr(m, name) for name, m in modules_with(package, path).items()
            if callable(getattr(m, name, None))}
