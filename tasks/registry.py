"""MLflow: one parent run per job, one child run per site, the model logged and registered."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch
from mlflow.models import infer_signature
from mlflow.tracking import MlflowClient
from prefect import get_run_logger, task

from insitu.config import Conf
from insitu.models.fraud_mlp import build_model


def code_version() -> str:
    repo = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        return sha or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def flat_params(conf: Conf) -> dict[str, Any]:
    t = conf.training
    return {
        "dataset": conf.dataset_name, "model": t.model.name, "hidden": t.model.hidden, "dropout": t.model.dropout,
        "optimizer": t.optimizer.name, "lr": t.optimizer.lr, "weight_decay": t.optimizer.weight_decay,
        "rounds": t.rounds, "local_epochs": t.local_epochs, "batch_size": t.batch_size,
        "aggregator": t.aggregator, "seed": t.seed, "strategy": t.strategy, "ranks_per_site": t.ranks_per_site,
        "min_sites": t.federation.min_sites, "round_deadline_s": t.federation.round_deadline_s,
        "config_hash": conf.config_hash(),
    }


@task(task_run_name="mlflow-start-{job_id}")
def start_runs(conf: Conf, job_id: str, sites: list[str], flow_run_id: str | None) -> dict[str, str]:
    """Create the parent run and one child run per site; returns their ids."""
    client = MlflowClient()
    name = f"insitu-{conf.dataset_name}"
    exp = client.get_experiment_by_name(name)
    exp_id = exp.experiment_id if exp else client.create_experiment(name)
    tags = {"job_id": job_id, "prefect_flow_run_id": str(flow_run_id), "code_version": code_version(),
            "sites": ",".join(sites)}
    parent = client.create_run(exp_id, run_name=f"retrain-{job_id}", tags=tags)
    for k, v in flat_params(conf).items():
        client.log_param(parent.info.run_id, k, v)
    client.log_param(parent.info.run_id, "sites", ",".join(sites))
    runs = {"parent": parent.info.run_id}
    for s in sites:
        child = client.create_run(exp_id, run_name=f"{s}-{job_id}",
                                  tags={**tags, "mlflow.parentRunId": parent.info.run_id, "site": s})
        client.log_param(child.info.run_id, "site", s)
        runs[s] = child.info.run_id
    return runs


def log_round(runs: dict[str, str], rnd: int, result: dict[str, Any]) -> None:
    client = MlflowClient()
    for s, m in result["site_metrics"].items():
        for k, v in m.items():
            client.log_metric(runs[s], k, float(v), step=rnd)
    client.log_metric(runs["parent"], "sites_in_round", float(len(result["sites"])), step=rnd)


@task(task_run_name="register-{job_id}")
def register_model(
    conf: Conf,
    job_id: str,
    runs: dict[str, str],
    state: dict[str, torch.Tensor],
    norm: dict[str, Any],
    site_metrics: dict[str, dict[str, float]],
    global_metrics: dict[str, float],
    sites: list[str],
) -> dict[str, Any]:
    """Log final metrics, log and register the model, tag its lineage and set alias ``challenger``."""
    logger = get_run_logger()
    client = MlflowClient()
    for s, m in site_metrics.items():
        for k, v in m.items():
            if not np.isnan(v):
                client.log_metric(runs[s], f"test_{k}", float(v))
                client.log_metric(runs["parent"], f"{s}_test_{k}", float(v))
    for k, v in global_metrics.items():
        if not np.isnan(v):
            client.log_metric(runs["parent"], f"global_test_{k}", float(v))
    model = build_model(conf.training.model, len(norm["mean"]))
    model.load_state_dict(state)
    model.eval()
    # The input example is the global feature mean: an aggregate, not anyone's row.
    example = np.asarray([norm["mean"]], dtype=np.float32)
    with torch.no_grad():
        out = model(torch.from_numpy(example)).numpy()
    signature = infer_signature(example, out)
    name = conf.training.registry.model_name
    with mlflow.start_run(run_id=runs["parent"]):
        info = mlflow.pytorch.log_model(model, name="model", signature=signature, input_example=example,
                                        serialization_format="pickle", registered_model_name=name)
    version = str(info.registered_model_version)
    tags = {"job_id": job_id, "dataset": conf.dataset_name, "sites": ",".join(sites),
            "config_hash": conf.config_hash(), "code_version": code_version(),
            "features": ",".join(norm["features"])}
    for k, v in tags.items():
        client.set_model_version_tag(name, version, k, v)
    for k, v in global_metrics.items():
        if not np.isnan(v):
            client.set_model_version_tag(name, version, f"global_test_{k}", f"{v:.6f}")
    client.set_registered_model_alias(name, "challenger", version)
    for run_id in runs.values():
        client.set_terminated(run_id, "FINISHED")
    logger.info("registered %s version %s, alias challenger", name, version)
    return {"model_name": name, "version": version, "alias": "challenger", "run_id": runs["parent"]}
