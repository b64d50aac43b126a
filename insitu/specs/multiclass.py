"""Multi-class classification: one logit per class, cross-entropy with class weights from federated counts.

A site publishes accuracy, macro-F1, log-loss and its confusion matrix (counts of true class × predicted
class over its split). The coordinator adds the sites' matrices: global accuracy and macro-F1 are then
exact, as if computed on the pooled rows, which no weighted mean of the sites' F1 scores would be.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import nn

from insitu.conf import SchemaConfig, TaskConfig
from insitu.federated.documents.base import MAX_CLASSES, Count, Doc
from insitu.federated.kinds import MIN_ROWS
from insitu.specs.base import GateMetric, LossFn, TaskSpec, class_counts


class MulticlassMetrics(Doc):
    """One model's metrics on a site's split (multi-class task): counts of true × predicted class."""

    task: Literal["multiclass"]
    accuracy: float
    macro_f1: float
    log_loss: float
    loss: float
    count: Annotated[float, Field(ge=MIN_ROWS)]
    confusion: Annotated[list[Annotated[list[Count], Field(max_length=MAX_CLASSES)]], Field(min_length=2,
                                                                                          max_length=MAX_CLASSES)]

    @model_validator(mode="after")
    def _square(self) -> MulticlassMetrics:
        k = len(self.confusion)
        if any(len(row) != k for row in self.confusion):
            raise ValueError("the confusion matrix is not square")
        if sum(map(sum, self.confusion)) != self.count:
            raise ValueError("the confusion matrix does not count the split's rows")
        return self


class MulticlassClassification(TaskSpec):
    name: ClassVar[str] = "multiclass"
    label_types: ClassVar[tuple[str, ...]] = ("category",)
    gate_metrics: ClassVar[tuple[GateMetric, ...]] = (GateMetric("macro_f1", True, 0.0),
                                                      GateMetric("accuracy", True, 0.0),
                                                      GateMetric("log_loss", False, None))
    metrics_schema: ClassVar[type[Doc]] = MulticlassMetrics
    summary_metrics: ClassVar[tuple[str, ...]] = ("accuracy", "macro_f1", "log_loss")

    def __init__(self, config: TaskConfig, schema: SchemaConfig) -> None:
        super().__init__(config, schema)
        self.classes = list(schema.columns[schema.label].values or [])

    @property
    def n_outputs(self) -> int:
        return len(self.classes)

    def loss_params(self, label_stats: Mapping[str, Any]) -> dict[str, Any]:
        counts = class_counts(label_stats, len(self.classes))
        n, k = sum(counts), len(counts)
        # "Balanced" weights n / (k · n_c): every class weighs as much in the loss, however rare; a class no
        # site holds gets weight 1 (it contributes no term anyway).
        return {"class_weights": [n / (k * c) if c else 1.0 for c in counts]}

    def loss(self, params: Mapping[str, Any], device: torch.device | None = None) -> LossFn:
        ce = nn.CrossEntropyLoss(weight=torch.tensor(params["class_weights"], dtype=torch.float32, device=device))
        return lambda outputs, y: ce(outputs, y.long())

    def site_metrics(self, outputs: torch.Tensor, y: np.ndarray, params: Mapping[str, Any],
                     floor: int = MIN_ROWS) -> dict[str, Any]:
        k = len(self.classes)
        truth = np.asarray(y).astype(np.int64)
        pred = outputs.argmax(dim=-1).numpy()
        confusion = np.zeros((k, k), dtype=np.int64)
        np.add.at(confusion, (truth, pred), 1)
        log_loss = float(nn.functional.cross_entropy(outputs, torch.from_numpy(truth)))
        return {"task": self.name, **confusion_metrics(confusion), "log_loss": log_loss,
                "loss": self.with_loss(outputs, y, params), "count": float(len(truth)),
                "confusion": confusion.tolist()}

    def combine(self, per_site: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
        used = [m for m in per_site.values() if "confusion" in m]
        if not used:
            return {"count": 0.0}
        total = np.sum([np.asarray(m["confusion"], dtype=np.int64) for m in used], axis=0)
        count = float(sum(float(m["count"]) for m in used))
        out = {**confusion_metrics(total), "count": count}
        for name in ("log_loss", "loss"):  # means over rows: the count-weighted mean is the pooled one
            out[name] = float(sum(float(m[name]) * float(m["count"]) for m in used) / count)
        return out


def confusion_metrics(confusion: np.ndarray | Sequence[Sequence[int]]) -> dict[str, float]:
    """Accuracy and macro-F1 from a confusion matrix (rows: true class, columns: predicted class).

    Macro-F1 averages over the classes present in the split (as true or predicted), as scikit-learn does
    when given the labels that occur.
    """
    c = np.asarray(confusion, dtype=np.float64)
    n = c.sum()
    tp = np.diag(c)
    true, predicted = c.sum(axis=1), c.sum(axis=0)
    present = (true + predicted) > 0
    f1 = np.divide(2 * tp, true + predicted, out=np.zeros_like(tp), where=present)
    return {"accuracy": float(tp.sum() / n) if n else float("nan"),
            "macro_f1": float(f1[present].mean()) if present.any() else float("nan")}
