"""What a learning task is: everything that differs between binary classification, multi-class
classification and regression, in one object (in the spirit of torchtitan's ``ModelSpec``).

A task spec knows, for a dataset's label column: how many outputs the model has, the loss (built from the
*federated* statistics of the labels, never from a row), what a site publishes about a model on its test
split (aggregates over at least the row floor) and the schema the exchange checks that against, how those
combine into global metrics, and which metrics the champion/challenger gate may use and in which direction.
Adding a task is one file of ``insitu/specs/`` plus its test; :mod:`insitu.specs` lists them once, and the
configuration and the exchange's metrics schema are built from that list.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from insitu.conf import SchemaConfig, TaskConfig
from insitu.federated.documents.base import Doc
from insitu.federated.kinds import MIN_ROWS

log = logging.getLogger(__name__)
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class GateMetric:
    """A metric the gate may decide on: its direction, and the bound a first model must meet by default."""

    name: str
    higher_is_better: bool
    default_bound: float | None = None  # a floor when higher is better, a ceiling otherwise; None: no bound

    def improvement(self, new: float, old: float) -> float:
        """How much better ``new`` is than ``old`` (negative when worse), whatever the direction."""
        return new - old if self.higher_is_better else old - new

    def meets(self, value: float, bound: float | None) -> bool:
        if bound is None:
            return not math.isnan(value)
        return value >= bound if self.higher_is_better else value <= bound


class TaskSpec(ABC):
    """One learning task. Instances are plain data (they travel to Dask workers and torchrun ranks)."""

    name: ClassVar[str]
    label_types: ClassVar[tuple[str, ...]]  # schema types the label column may have for this task
    gate_metrics: ClassVar[tuple[GateMetric, ...]]  # the first is the default primary metric
    summary_metrics: ClassVar[tuple[str, ...]]  # the per-site columns of the job summary
    # What a site publishes about one model (site_metrics' output) as the exchange checks it: a strict document
    # with a ``task`` key that is Literal[name]. The exchange's metrics schema is the union of the tasks' ones.
    metrics_schema: ClassVar[type[Doc]]

    def __init__(self, config: TaskConfig, schema: SchemaConfig) -> None:
        label = schema.columns[schema.label]
        if label.type not in self.label_types:
            raise ValueError(f"task {self.name!r} needs a label column of type {' or '.join(self.label_types)}; "
                             f"{schema.label!r} has type {label.type}")
        self.config = config
        self.label = schema.label

    # ---- the model's shape and the loss
    @property
    @abstractmethod
    def n_outputs(self) -> int:
        """Outputs of the model: 1 for binary and regression, one logit per class otherwise."""

    @property
    def output_link(self) -> str:
        """What the registered (serving) model applies to its output: ``identity``, or ``exp`` where training's
        output is a log (Poisson's log-rate), so that a served prediction is in the label's range."""
        return "identity"

    def output_norm(self, label_stats: Mapping[str, Any]) -> tuple[float, float]:
        """``(shift, scale)`` the model applies to its raw output (regression predicts in the label's units)."""
        return 0.0, 1.0

    @abstractmethod
    def loss_params(self, label_stats: Mapping[str, Any]) -> dict[str, Any]:
        """The loss's parameters from the combined label statistics of all sites (e.g. class weights)."""

    @abstractmethod
    def loss(self, params: Mapping[str, Any], device: torch.device | None = None) -> LossFn:
        """``loss(outputs, y)`` for training; ``y`` as prepared (float32: 0/1, class index or value)."""

    # ---- metrics: on a site, then combined on the coordinator
    @abstractmethod
    def site_metrics(self, outputs: torch.Tensor, y: np.ndarray, params: Mapping[str, Any],
                     floor: int = MIN_ROWS) -> dict[str, Any]:
        """What a site publishes about a model on its split: metrics and the aggregates they combine from.

        Called only on splits of at least ``floor`` rows (see :func:`insitu.metrics.withheld` otherwise).
        """

    @abstractmethod
    def combine(self, per_site: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
        """Global metrics from the sites' published ones (sites that withheld theirs are already left out)."""

    def global_metrics(self, per_site: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
        """:meth:`combine` over the sites that published metrics; those that withheld theirs (fewer rows than
        the floor) are left out of every metric and named in the log."""
        from insitu.metrics import withheld_sites

        skipped = withheld_sites(per_site)
        if skipped:
            log.warning("global metrics leave out %s: metrics withheld (fewer than %d rows)", skipped, MIN_ROWS)
        return self.combine({s: m for s, m in per_site.items() if s not in skipped})

    def gate_metric(self, name: str | None) -> GateMetric:
        """The gate metric called ``name`` (None: the task's default)."""
        if name is None:
            return self.gate_metrics[0]
        for m in self.gate_metrics:
            if m.name == name:
                return m
        raise ValueError(f"task {self.name!r} gates on {[m.name for m in self.gate_metrics]}, not {name!r}")

    def with_loss(self, outputs: torch.Tensor, y: np.ndarray, params: Mapping[str, Any]) -> float:
        return float(self.loss(params, outputs.device)(outputs, torch.from_numpy(np.asarray(y, np.float32))))


def class_counts(stats: Mapping[str, Any], n_classes: int) -> list[int]:
    counts = [int(c) for c in stats.get("label_counts") or []]
    if len(counts) != n_classes:
        raise ValueError(f"label statistics count {len(counts)} classes; the task has {n_classes}")
    return counts
