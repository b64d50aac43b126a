"""Regression: one output in the label's units, MSE or Huber on the standardised label.

The model predicts ``shift + scale · raw`` with the label's federated mean and standard deviation as
shift and scale, so training sees a standardised target whatever the label's units, and the registered
model predicts in those units. A site publishes its sums of squared and absolute errors and of the label
and its square; the coordinator adds them up, so global RMSE, MAE and R² are exact for the pooled rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field
from torch import nn

from insitu.federated.documents.base import Doc
from insitu.federated.kinds import MIN_ROWS
from insitu.specs.base import GateMetric, LossFn, TaskSpec


class RegressionMetrics(Doc):
    """One model's metrics on a site's split (regression task), with the sums they combine from."""

    task: Literal["regression"]
    rmse: float
    mae: float
    r2: float
    loss: float
    count: Annotated[float, Field(ge=MIN_ROWS)]
    sse: Annotated[float, Field(ge=0.0)]
    sae: Annotated[float, Field(ge=0.0)]
    label_sum: float
    label_sumsq: Annotated[float, Field(ge=0.0)]


class Regression(TaskSpec):
    name: ClassVar[str] = "regression"
    label_types: ClassVar[tuple[str, ...]] = ("float", "int")
    gate_metrics: ClassVar[tuple[GateMetric, ...]] = (GateMetric("rmse", False, None), GateMetric("mae", False, None),
                                                      GateMetric("r2", True, 0.0))
    metrics_schema: ClassVar[type[Doc]] = RegressionMetrics
    summary_metrics: ClassVar[tuple[str, ...]] = ("rmse", "mae", "r2")

    @property
    def n_outputs(self) -> int:
        return 1

    def output_norm(self, label_stats: Mapping[str, Any]) -> tuple[float, float]:
        n = int(label_stats["n"])
        if n <= 0:
            raise ValueError("no samples: cannot compute the label's mean and std")
        mean = float(label_stats["label_sum"]) / n
        var = max(float(label_stats["label_sumsq"]) / n - mean * mean, 0.0)
        return mean, max(math.sqrt(var), 1e-6)

    def loss_params(self, label_stats: Mapping[str, Any]) -> dict[str, Any]:
        return {"label_scale": self.output_norm(label_stats)[1]}

    def loss(self, params: Mapping[str, Any], device: torch.device | None = None) -> LossFn:
        scale = float(params["label_scale"])
        inner = nn.HuberLoss(delta=self.config.huber_delta) if self.config.loss == "huber" else nn.MSELoss()
        return lambda outputs, y: inner(outputs / scale, y / scale)

    def site_metrics(self, outputs: torch.Tensor, y: np.ndarray, params: Mapping[str, Any],
                     floor: int = MIN_ROWS) -> dict[str, Any]:
        pred = outputs.detach().numpy().astype(np.float64)
        truth = np.asarray(y, dtype=np.float64)
        err = pred - truth
        sums = {"sse": float((err * err).sum()), "sae": float(np.abs(err).sum()), "label_sum": float(truth.sum()),
                "label_sumsq": float((truth * truth).sum()), "count": float(len(truth))}
        return {"task": self.name, **sums, **from_sums(sums), "loss": self.with_loss(outputs, y, params)}

    def combine(self, per_site: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
        used = [m for m in per_site.values() if "sse" in m]
        if not used:
            return {"count": 0.0}
        sums = {k: float(sum(float(m[k]) for m in used)) for k in ("sse", "sae", "label_sum", "label_sumsq", "count")}
        loss = sum(float(m["loss"]) * float(m["count"]) for m in used) / sums["count"]
        return {**from_sums(sums), "loss": float(loss), "count": sums["count"]}


def from_sums(s: Mapping[str, float]) -> dict[str, float]:
    """RMSE, MAE and R² from the sums of squared and absolute errors and of the label and its square."""
    n = s["count"]
    if n <= 0:
        return {"rmse": float("nan"), "mae": float("nan"), "r2": float("nan")}
    ss_tot = s["label_sumsq"] - s["label_sum"] ** 2 / n
    return {"rmse": math.sqrt(s["sse"] / n), "mae": s["sae"] / n,
            "r2": 1.0 - s["sse"] / ss_tot if ss_tot > 0 else float("nan")}
