"""Learning tasks, one file each: the list of learning tasks that a job's names are resolved against.

``TASKS`` is the one list of task names, found in this package: a new task is a
:class:`~insitu.specs.base.TaskSpec` subclass with its own ``name`` in a file of its own here, with its test;
nothing else to edit.
"""

from __future__ import annotations

from insitu.conf import SchemaConfig, TaskConfig
from insitu.plugins import named_subclasses
from insitu.specs.base import GateMetric, TaskSpec

TASKS: dict[str, type[TaskSpec]] = named_subclasses(__name__, __path__, TaskSpec)


def build_task(config: TaskConfig, schema: SchemaConfig) -> TaskSpec:
    """The task ``config`` names, for a dataset with ``schema`` (its label column decides the classes)."""
    if config.name not in TASKS:
        raise ValueError(f"unknown task {config.name!r}; known: {sorted(TASKS)}")
    return TASKS[config.name](config, schema)


def task_for_label(name: str = "binary", label_type: str = "bool", classes: list[str] | None = None,
                   label_min: float | None = None, **options: object) -> TaskSpec:
    """The task ``name`` for a label of ``label_type`` (and ``classes``, or a number's ``label_min``), without a
    dataset's schema: for benchmarks, notebooks and tests that train on arrays. ``options`` are the task's
    keys, e.g. ``task_for_label("regression", "int", label_min=0, loss="poisson")`` for counts."""
    label = {"type": label_type, **({"values": classes} if classes else {}),
             **({"min": label_min} if label_min is not None else {})}
    schema = SchemaConfig.model_validate({"id": "id", "label": "label",
                                          "columns": {"id": {"type": "string"}, "label": label}})
    return build_task(TaskConfig.model_validate({"name": name, **options}), schema)


__all__ = ["TASKS", "GateMetric", "TaskSpec", "build_task", "task_for_label"]
