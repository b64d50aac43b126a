"""Regression: one output; MSE or Huber on the standardised label, or Poisson with a log link for counts.

With ``loss: mse`` or ``huber`` the model predicts ``shift + scale · raw`` with the label's federated mean and
standard deviation as shift and scale, so training sees a standardised target whatever the label's units, and
the registered model predicts in those units.

With ``loss: poisson`` (a count label, such as visits per year) the model's output is the log of the expected
count: predictions are ``exp(output)``, never negative (:meth:`Regression.predict`; the registered model
outputs the log-rate). Its shift is the log of the label's federated mean, its scale 1, so an untrained model
predicts the mean count. The loss is torch's Poisson negative log-likelihood (log input) on the raw count plus
the saturated model's term: the mean half Poisson deviance, as scikit-learn's ``PoissonRegressor`` minimises,
with the likelihood's gradients and 0 for a perfect fit.

A site publishes its sums of squared and absolute errors of the predictions (in label units) and of the label
and its square; the coordinator adds them up, so global RMSE, MAE and R² are exact for the pooled rows. Its
``loss`` is a mean over its rows, so the count-weighted mean is the pooled one; for Poisson the global metrics
add ``deviance``, the pooled mean Poisson deviance (scikit-learn's ``mean_poisson_deviance``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field
from torch import nn

from insitu.conf import SchemaConfig, TaskConfig
from insitu.federated.documents.base import Doc
from insitu.federated.kinds import MIN_ROWS
from insitu.specs.base import GateMetric, LossFn, TaskSpec

# The smallest mean count whose log starts a Poisson model (a label that is 0 everywhere has no log).
MIN_RATE = 1e-6


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

    def __init__(self, config: TaskConfig, schema: SchemaConfig) -> None:
        super().__init__(config, schema)
        self.poisson = config.loss == "poisson"
        if self.poisson:
            low = schema.columns[schema.label].min
            if low is None or low < 0:
                has = "declares no min" if low is None else f"declares min: {low:g}"
                raise ValueError(f"loss 'poisson' is for counts, which are never negative, and label column "
                                 f"{schema.label!r} {has}; declare min: 0 on it in conf/datasets.yaml (rows below "
                                 "are then quarantined), or use loss: mse or huber for a label that can be negative")
            # The Poisson fit itself (mean half deviance; lower is better), which every site publishes as `loss`.
            self.gate_metrics = (*Regression.gate_metrics, GateMetric("loss", False, None))

    @property
    def n_outputs(self) -> int:
        return 1

    def output_norm(self, label_stats: Mapping[str, Any]) -> tuple[float, float]:
        n = int(label_stats["n"])
        if n <= 0:
            raise ValueError("no samples: cannot compute the label's mean and std")
        mean = float(label_stats["label_sum"]) / n
        if self.poisson:
            return math.log(max(mean, MIN_RATE)), 1.0
        var = max(float(label_stats["label_sumsq"]) / n - mean * mean, 0.0)
        return mean, max(math.sqrt(var), 1e-6)

    def loss_params(self, label_stats: Mapping[str, Any]) -> dict[str, Any]:
        if self.poisson:
            return {}  # the raw count needs no scale
        return {"label_scale": self.output_norm(label_stats)[1]}

    def loss(self, params: Mapping[str, Any], device: torch.device | None = None) -> LossFn:
        if self.poisson:
            return poisson_half_deviance
        scale = float(params["label_scale"])
        inner = nn.HuberLoss(delta=self.config.huber_delta) if self.config.loss == "huber" else nn.MSELoss()
        return lambda outputs, y: inner(outputs / scale, y / scale)

    @property
    def output_link(self) -> str:
        return "exp" if self.poisson else "identity"

    def predict(self, outputs: torch.Tensor) -> torch.Tensor:
        """Predictions in the label's units from the model's outputs: ``exp`` of the log-rate for Poisson."""
        return torch.exp(outputs.double()) if self.poisson else outputs

    def site_metrics(self, outputs: torch.Tensor, y: np.ndarray, params: Mapping[str, Any],
                     floor: int = MIN_ROWS) -> dict[str, Any]:
        pred = self.predict(outputs.detach()).numpy().astype(np.float64)
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
        out = {**from_sums(sums), "loss": float(loss), "count": sums["count"]}
        if self.poisson:
            out["deviance"] = 2.0 * float(loss)
        return out


def poisson_half_deviance(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean half Poisson deviance of log-rates ``outputs`` for counts ``y``: ``exp(η) − y·η + y·log y − y``.

    torch's Poisson negative log-likelihood (log input, without the constant ``log y!``) plus the saturated
    model's term, which does not depend on the model: the same gradients, and 0 when ``exp(η) = y``.
    """
    nll = nn.functional.poisson_nll_loss(outputs, y, log_input=True, full=False)
    return nll + (torch.xlogy(y, y) - y).mean()


def from_sums(s: Mapping[str, float]) -> dict[str, float]:
    """RMSE, MAE and R² from the sums of squared and absolute errors and of the label and its square."""
    n = s["count"]
    if n <= 0:
        return {"rmse": float("nan"), "mae": float("nan"), "r2": float("nan")}
    ss_tot = s["label_sumsq"] - s["label_sum"] ** 2 / n
    return {"rmse": math.sqrt(s["sse"] / n), "mae": s["sae"] / n,
            "r2": 1.0 - s["sse"] / ss_tot if ss_tot > 0 else float("nan")}
