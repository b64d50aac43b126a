"""Binary classification: one logit, BCE with the positive class weighted by the federated class balance.

A site publishes ROC-AUC, PR-AUC, loss, count and positive rate, plus per-class histograms of its scores
(coarsened to the row floor) from which the coordinator draws a global PR curve without any row's score.
Global metrics are the sample-weighted means of the sites' (an AUC does not add up exactly across sites;
the histograms' global curve does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import nn

from insitu.federated.documents.base import MAX_BINS, Count, Doc
from insitu.federated.kinds import MIN_ROWS
from insitu.metrics import binary_metrics, floor_histograms, weighted_global
from insitu.specs.base import GateMetric, LossFn, TaskSpec, class_counts

BINS = 100


class BinaryMetrics(Doc):
    """One model's metrics on a site's test split (binary task), over at least the floor of rows.

    ``hist_pos``/``hist_neg`` count the scores of each class per bin of a fixed grid; they are coarsened
    before publication (:func:`insitu.metrics.floor_histograms`) so that no non-empty bin holds fewer rows
    than the floor. ``task`` may be left out: documents written before there were other tasks are binary.
    """

    task: Literal["binary"] = "binary"
    roc_auc: float
    pr_auc: float
    loss: float
    count: Annotated[float, Field(ge=MIN_ROWS)]
    positive_rate: float
    hist_pos: Annotated[list[Count], Field(min_length=1, max_length=MAX_BINS)] | None = None
    hist_neg: Annotated[list[Count], Field(min_length=1, max_length=MAX_BINS)] | None = None

    @model_validator(mode="after")
    def _histograms(self) -> BinaryMetrics:
        pos, neg = self.hist_pos, self.hist_neg
        if pos is None and neg is None:
            return self
        if pos is None or neg is None or len(pos) != len(neg):
            raise ValueError("hist_pos and hist_neg come together, with the same bins")
        if any(0 < c < MIN_ROWS for c in (*pos, *neg)):
            raise ValueError(f"a histogram bin holds fewer than {MIN_ROWS} rows")
        if sum(pos) + sum(neg) > self.count:
            raise ValueError("the histograms count more rows than the metrics")
        return self


class BinaryClassification(TaskSpec):
    name: ClassVar[str] = "binary"
    label_types: ClassVar[tuple[str, ...]] = ("bool",)
    gate_metrics: ClassVar[tuple[GateMetric, ...]] = (GateMetric("pr_auc", True, 0.05),
                                                      GateMetric("roc_auc", True, 0.5))
    metrics_schema: ClassVar[type[Doc]] = BinaryMetrics
    summary_metrics: ClassVar[tuple[str, ...]] = ("roc_auc", "pr_auc", "loss")

    @property
    def n_outputs(self) -> int:
        return 1

    def loss_params(self, label_stats: Mapping[str, Any]) -> dict[str, Any]:
        neg, pos = class_counts(label_stats, 2)
        # Balances the rare class in the loss; the same weight on every site.
        return {"pos_weight": neg / max(pos, 1)}

    def loss(self, params: Mapping[str, Any], device: torch.device | None = None) -> LossFn:
        return nn.BCEWithLogitsLoss(pos_weight=torch.tensor(float(params["pos_weight"]), device=device))

    def site_metrics(self, outputs: torch.Tensor, y: np.ndarray, params: Mapping[str, Any],
                     floor: int = MIN_ROWS) -> dict[str, Any]:
        p = torch.sigmoid(outputs).numpy()
        out: dict[str, Any] = {"task": self.name, **binary_metrics(y, p, self.with_loss(outputs, y, params))}
        edges = np.linspace(0.0, 1.0, BINS + 1)
        # A bin holding a few scores would place individual rows: bins are merged until each holds enough.
        hists = floor_histograms(np.histogram(p[y == 1], bins=edges)[0], np.histogram(p[y == 0], bins=edges)[0],
                                 floor)
        if hists is not None:
            out["hist_pos"], out["hist_neg"] = hists
        return out

    def combine(self, per_site: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
        return weighted_global({s: {k: v for k, v in m.items() if isinstance(v, int | float)}
                                for s, m in per_site.items()})
