"""No task of the Prefect layer pays for a cache key (see tasks/__init__.py): each is declared NO_CACHE."""

from __future__ import annotations

import importlib
import pkgutil

from prefect import Task
from prefect.cache_policies import NO_CACHE

import tasks


def test_every_task_is_declared_without_a_cache_policy() -> None:
    found = {}
    for info in pkgutil.iter_modules(tasks.__path__):
        module = importlib.import_module(f"tasks.{info.name}")
        found.update({f"{info.name}.{n}": t for n, t in vars(module).items()
                      if isinstance(t, Task) and t.__module__ == module.__name__})
    assert len(found) >= 15, sorted(found)  # every task module was imported
    assert not [n for n, t in found.items() if t.cache_policy is not NO_CACHE], "declare cache_policy=NO_CACHE"
