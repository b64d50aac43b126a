"""The sites' metrics: ``metrics/evaluate.json`` (each model on the test split) and
``metrics/validation-round-N.json`` (a global model on the validation split).

A model's metrics follow the schema of the job's learning task. Each task carries its own
(:attr:`insitu.specs.base.TaskSpec.metrics_schema`) and :data:`MODEL_METRICS` is assembled from the registered
tasks, so a new task's metrics cross the exchange without an edit here. A site whose split is under the row
floor publishes :class:`Withheld` instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Union

from pydantic import Discriminator, Field, Tag, model_validator

from insitu.federated.documents.base import MAX_ROUNDS, Doc, FlowRunId, Label, RanAs, Site, StateName
from insitu.specs import TASKS

WITHHELD = "withheld"


class Withheld(Doc):
    """Published instead of a model's metrics when the split is under the floor."""

    withheld: Label


def task_metrics(tasks: Mapping[str, Any]) -> dict[str, type[Doc]]:
    """Task name → its metrics schema, each checked to say its task in its ``task`` key.

    Raises
    ------
    TypeError
        When a task's schema has no ``task`` key, or its key admits another name (a document of that task
        would then be checked against the wrong schema, or refused by the right one).
    """
    out: dict[str, type[Doc]] = {}
    for name, task in tasks.items():
        schema = task.metrics_schema
        field = schema.model_fields.get("task")
        if name == WITHHELD or field is None or getattr(field.annotation, "__args__", None) != (name,):
            raise TypeError(f"task {name!r}: its metrics_schema {schema.__name__} needs the key "
                            f"task: Literal[{name!r}]")
        out[name] = schema
    return out


def untagged_task(schemas: Mapping[str, type[Doc]]) -> str | None:
    """The task of a metrics document without a ``task`` key: the one whose schema gives it a default (binary,
    whose documents were written before there were other tasks)."""
    return next((name for name, schema in schemas.items() if not schema.model_fields["task"].is_required()), None)


def metrics_or_withheld(schemas: Mapping[str, type[Doc]]) -> Any:
    """The type of one model's published metrics: one of ``schemas`` by its ``task`` key, or :class:`Withheld`.

    The member is chosen by the key that tells them apart, so that a refusal explains the one schema that
    applies rather than every member's.
    """
    default = untagged_task(schemas)

    def tag(v: object) -> str:
        if not isinstance(v, dict) or WITHHELD in v:
            return WITHHELD
        return str(v.get("task", default))

    members = tuple(Annotated[schema, Tag(name)] for name, schema in schemas.items())
    # Union[...] of a tuple: the members are known only when the tasks are
    return Annotated[Union[(*members, Annotated[Withheld, Tag(WITHHELD)])], Discriminator(tag)]


MODEL_METRICS: dict[str, type[Doc]] = task_metrics(TASKS)
MetricsOrWithheld = metrics_or_withheld(MODEL_METRICS)


class Evaluation(Doc):
    """``metrics/evaluate.json`` of a site."""

    site: Site
    ran_as: RanAs
    models: Annotated[dict[StateName, MetricsOrWithheld], Field(max_length=8)]
    flow_run_id: FlowRunId | None = None  # the site's run that scored: the coordinator counts its own runs' only


class Validation(Doc):
    """``metrics/validation-round-N.json`` of a site: global model N scored on the site's validation split."""

    site: Site
    round: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    metrics: MetricsOrWithheld

    @model_validator(mode="after")
    def _no_histograms(self) -> Validation:
        if getattr(self.metrics, "hist_pos", None) is not None:
            raise ValueError("a validation publishes no score histograms")
        return self
