"""MLflow tracking: one parent run per job and one child run per site, with what each round, validation and
phase records on them.

The model registry's side (registering a version, reading the champion back) is ``tasks/registration.py``;
the gate and its lock are ``tasks/promotion.py``.
"""

from __future__ import annotations

import functools
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from insitu.conf import TrainingConfig
from insitu.federated.validation import RoundValidation
from insitu.gate import Promotion
from insitu.job import JobSpec
from insitu.parallel.strategies import strategy


@functools.cache
def code_version() -> str:
    """The checkout's commit (12 hex digits), recorded on every run and version; ``unknown`` outside git."""
    repo = Path(__file__).resolve().parent.parent
    try:
        # safe.directory: the coordinator runs as its own OS user, the checkout belongs to another one.
        sha = subprocess.run(["git", "-c", f"safe.directory={repo}", "rev-parse", "--short=12", "HEAD"], cwd=repo,
                             capture_output=True, text=True, timeout=5).stdout.strip()
        return sha or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def parallel_params(training: TrainingConfig) -> dict[str, Any]:
    """The parts of ``parallel:`` the job's strategy uses, defaults filled in (the rest would only mislead a
    comparison)."""
    return strategy(training.strategy).options_of(training).model_dump(mode="json")


def flat_params(conf: JobSpec) -> dict[str, Any]:
    """The job's configuration as the parent run's MLflow params (one level deep, so runs compare side by side)."""
    t = conf.training
    return {
        "dataset": conf.dataset_name, "model": t.model.name, "hidden": t.model.hidden, "dropout": t.model.dropout,
        "optimizer": t.optimizer.name, "lr": t.optimizer.lr, "weight_decay": t.optimizer.weight_decay,
        "rounds": t.rounds, "local_epochs": t.local_epochs, "batch_size": t.batch_size,
        "aggregator": t.aggregator.name, "aggregator_options": t.aggregator.options,
        "task": t.task.name, "seed": t.seed, "strategy": t.strategy, "ranks_per_site": t.ranks_per_site,
        "model_options": t.model.options, "parallel": parallel_params(t),
        "min_sites": t.federation.min_sites, "round_deadline_s": t.federation.round_deadline_s,
        "federation_mode": t.federation.mode,
        **({"federation_async": t.federation.asynchronous.model_dump(mode="json")}
           if t.federation.mode == "async" else {}),
        "config_hash": conf.config_hash,
    }


@task(cache_policy=NO_CACHE, task_run_name="mlflow-start-{job_id}")
def start_runs(conf: JobSpec, job_id: str, sites: list[str], flow_run_id: str | None) -> dict[str, str]:
    """Create the parent run and one child run per site; returns their ids.

    A re-run of the same job continues the runs its first attempt created, so the job's rounds stay
    one metric series per site in MLflow.
    """
    logger = get_run_logger()
    client = MlflowClient()
    name = f"insitu-{conf.dataset_name}"
    exp = client.get_experiment_by_name(name)
    exp_id = exp.experiment_id if exp else client.create_experiment(name)
    tags = {"job_id": job_id, "prefect_flow_run_id": str(flow_run_id), "code_version": code_version(),
            "sites": ",".join(sites)}
    found = client.search_runs([exp_id], f"tags.job_id = '{job_id}'", max_results=1000)
    parents = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
    if parents:
        parent_id = parents[0].info.run_id
        logger.info("job %s re-run: continuing its MLflow run %s", job_id, parent_id)
        client.set_tag(parent_id, "prefect_flow_run_id", str(flow_run_id))
    else:
        parent_id = client.create_run(exp_id, run_name=f"retrain-{job_id}", tags=tags).info.run_id
        params = {**flat_params(conf), "sites": ",".join(sites)}
        client.log_batch(parent_id, params=[Param(k, str(v)) for k, v in params.items()])
    children = {r.data.tags.get("site"): r.info.run_id for r in found
                if r.data.tags.get("mlflow.parentRunId") == parent_id}
    runs = {"parent": parent_id}
    for s in sites:
        if s not in children:
            child = client.create_run(exp_id, run_name=f"{s}-{job_id}",
                                      tags={**tags, "mlflow.parentRunId": parent_id, "site": s})
            client.log_batch(child.info.run_id, params=[Param("site", s)])
            children[s] = child.info.run_id
        runs[s] = children[s]
    return runs


def log_metrics(client: MlflowClient, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
    """One request per run (not one per metric); NaN (e.g. AUC of a one-class split) is left out."""
    now = int(time.time() * 1000)
    batch = [Metric(k, float(v), now, step) for k, v in metrics.items() if not np.isnan(v)]
    if batch:
        client.log_batch(run_id, metrics=batch)


def logged_rounds(runs: dict[str, str]) -> dict[str, set[int]]:
    """Per run of the job (each site's child, and the parent), the rounds it already records.

    A re-run logs only what is missing, run by run: a coordinator stopped in the middle of logging a round
    (some children written, the parent not) neither loses nor duplicates a point.
    """
    client = MlflowClient()
    out = {"parent": {int(m.step) for m in client.get_metric_history(runs["parent"], "sites_in_round")},
           "validation": {int(m.step) for m in client.get_metric_history(runs["parent"], "val_sites")}}
    for key, run_id in runs.items():
        if key != "parent":
            out[key] = {int(m.step) for m in client.get_metric_history(run_id, "train_loss")}
            out[f"validation-{key}"] = {int(m.step) for m in client.get_metric_history(run_id, "val_count")}
    return out


def log_round(runs: dict[str, str], rnd: int, result: dict[str, Any],
              logged: dict[str, set[int]] | None = None) -> None:
    """One round's site series and the parent's count of sites, skipping runs that already hold it."""
    client = MlflowClient()
    logged = logged or {}
    for s, m in result["site_metrics"].items():
        if rnd not in logged.get(s, set()):
            log_metrics(client, runs[s], m, step=rnd)
    if rnd not in logged.get("parent", set()):
        log_metrics(client, runs["parent"], {"sites_in_round": len(result["sites"])}, step=rnd)


def log_async_version(runs: dict[str, str], result: dict[str, Any], logged: dict[str, set[int]] | None = None) -> None:
    """Async mode: one applied global version as a step series (step = version). Each applied update's site
    gets its training numbers and staleness/weight on its child run; the parent gets the version's staleness,
    weight, bytes, the count per site and the refusals so far. Runs that already hold the step are skipped."""
    client = MlflowClient()
    logged = logged or {}
    version = int(result["round"]) + 1
    for s, m in result["site_metrics"].items():
        if s in runs and version not in logged.get(s, set()):
            log_metrics(client, runs[s], {k: float(v) for k, v in m.items() if isinstance(v, int | float)},
                         step=version)
    if version in logged.get("parent", set()):
        return
    applied = result.get("applied") or []
    stale = [float(e["staleness"]) for e in applied] or [0.0]
    weights = [float(e["weight"]) for e in applied] or [0.0]
    per_site = {f"async_from_{e['site']}": 0.0 for e in applied}
    for e in applied:
        per_site[f"async_from_{e['site']}"] += 1.0
    log_metrics(client, runs["parent"], {
        "sites_in_round": len(result["sites"]), "async_updates": float(len(applied)),
        "async_staleness": sum(stale) / len(stale), "async_staleness_max": max(stale),
        "async_alpha": sum(weights) / len(weights), "async_update_bytes": float(result.get("update_bytes", 0)),
        "async_refused_total": float(result.get("refused_total", 0)), **per_site}, step=version)


def log_phase_time(run_id: str, name: str, seconds: float) -> None:
    """A phase's wall time on the job's parent run (e.g. ``updates_wall_s``)."""
    log_metrics(MlflowClient(), run_id, {name: seconds})


def log_validation(runs: dict[str, str], rnd: int, val: RoundValidation, per_site: dict[str, dict[str, Any]],
                   logged: dict[str, set[int]] | None = None) -> None:
    """Global model ``rnd``'s validation: each site's metrics on its child run (``val_*``), the combined ones on
    the parent (``global_val_*``, and ``val_sites``), as step series; each run skips the steps it holds."""
    client = MlflowClient()
    logged = logged or {}
    for s, m in per_site.items():
        numbers = {f"val_{k}": float(v) for k, v in m.items() if isinstance(v, int | float)}
        if s in runs and numbers and rnd not in logged.get(f"validation-{s}", set()):
            log_metrics(client, runs[s], numbers, step=rnd)
    if rnd not in logged.get("validation", set()):
        log_metrics(client, runs["parent"], {**{f"global_val_{k}": v for k, v in val.metrics.items()},
                                              "val_sites": float(len(val.sites))}, step=rnd)



def finish_runs(runs: dict[str, str], promotion: Promotion) -> None:
    """The gate's outcome on the parent run; every run of the job marked finished."""
    client = MlflowClient()
    client.set_tag(runs["parent"], "gate", "passed" if promotion.passed else "failed")
    client.set_tag(runs["parent"], "gate_reason", promotion.reason)
    for run_id in runs.values():
        client.set_terminated(run_id, "FINISHED")
