"""Score a model from the exchange on the site's own test split; publish the metrics only."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from prefect import task
from torch import nn

from insitu.metrics import binary_metrics
from insitu.models.fraud_mlp import build_model
from tasks.context import SiteContext

BINS = 100
MIN_HISTOGRAM_ROWS = 10


def score(model: nn.Module, x: np.ndarray, y: np.ndarray, pos_weight: float) -> dict[str, Any]:
    """Metrics, plus per-class histograms of the scores: aggregates from which the coordinator can draw
    a global PR curve without ever seeing a row's score."""
    model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(x))
        loss = nn.functional.binary_cross_entropy_with_logits(
            logits, torch.from_numpy(y), pos_weight=torch.tensor(pos_weight)
        )
    p = torch.sigmoid(logits).numpy()
    edges = np.linspace(0.0, 1.0, BINS + 1)
    out: dict[str, Any] = binary_metrics(y, p, float(loss))
    # A histogram of a handful of scores would place individual rows; only publish it over enough of each class.
    if min(int((y == 1).sum()), int((y == 0).sum())) >= MIN_HISTOGRAM_ROWS:
        out["hist_pos"] = np.histogram(p[y == 1], bins=edges)[0].tolist()
        out["hist_neg"] = np.histogram(p[y == 0], bins=edges)[0].tolist()
    return out


@task(retries=1, task_run_name="evaluate-{ctx.site}-{name}")
def evaluate_weights(
    ctx: SiteContext, name: str, x: np.ndarray, y: np.ndarray, n_features: int, pos_weight: float
) -> dict[str, Any]:
    state, _ = ctx.exchange.get_state("weights", name, writer="coordinator")
    model = build_model(ctx.conf.training.model, n_features)
    model.load_state_dict(state)
    return score(model, x, y, pos_weight)
