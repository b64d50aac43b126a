"""The job's figures on its MLflow parent run: metrics per site, and the learning task's curves or matrix."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from mlflow.tracking import MlflowClient
from prefect import task
from prefect.cache_policies import NO_CACHE

from insitu.plots import confusion_figure, pr_curve_figure, site_metrics_figure


@task(cache_policy=NO_CACHE, task_run_name="mlflow-figures")
def log_figures(
    parent_run_id: str, evaluated: dict[str, dict[str, Any]], site_metrics: dict[str, dict[str, float]],
    metric_names: list[str],
) -> None:
    """A per-site metrics bar chart; for a binary task PR curves (per site and global, from score
    histograms), for a multi-class one the global confusion matrix (the sum of the sites')."""
    fig = site_metrics_figure(site_metrics, metric_names)
    MlflowClient().log_figure(parent_run_id, fig, "plots/site_metrics.png")
    plt.close(fig)
    matrices = [np.asarray(m["confusion"]) for m in evaluated.values() if "confusion" in m]
    if matrices:
        fig = confusion_figure(np.sum(matrices, axis=0))
        MlflowClient().log_figure(parent_run_id, fig, "plots/confusion_matrix.png")
        plt.close(fig)
    if not any(m.get("task", "binary") == "binary" for m in evaluated.values() if "withheld" not in m):
        return
    curves = {s: (m["hist_pos"], m["hist_neg"]) for s, m in evaluated.items() if "hist_pos" in m}
    withheld = sorted(s for s in evaluated if s not in curves)
    if withheld:  # the figure names them too; the tag makes them searchable
        MlflowClient().set_tag(parent_run_id, "pr_curve_withheld", ",".join(withheld))
    if curves:
        pos = np.sum([c[0] for c in curves.values()], axis=0)
        neg = np.sum([c[1] for c in curves.values()], axis=0)
        curves = {**curves, "global": (pos, neg)}
    fig = pr_curve_figure(curves, withheld=withheld)
    MlflowClient().log_figure(parent_run_id, fig, "plots/pr_curve.png")
    plt.close(fig)
