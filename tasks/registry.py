"""MLflow: one parent run per job, one child run per site, the model logged and registered."""

from __future__ import annotations

import functools
import hashlib
import subprocess
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch
from mlflow.entities import Metric, Param
from mlflow.models import infer_signature
from mlflow.tracking import MlflowClient
from prefect import get_run_logger, task

from insitu.conf import TrainingConfig
from insitu.federated.exchange import state_from_bytes, state_to_bytes
from insitu.federated.validation import RoundValidation
from insitu.job import JobSpec
from insitu.models import Normalization, build_model

WEIGHTS_DIR = "weights"
WEIGHTS_FILE = "state.pt"


@functools.cache
def code_version() -> str:
    repo = Path(__file__).resolve().parent.parent
    try:
        # safe.directory: the coordinator runs as its own OS user, the checkout belongs to another one.
        sha = subprocess.run(["git", "-c", f"safe.directory={repo}", "rev-parse", "--short=12", "HEAD"], cwd=repo,
                             capture_output=True, text=True, timeout=5).stdout.strip()
        return sha or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def parallel_params(t: TrainingConfig) -> dict[str, Any]:
    """The parts of ``parallel:`` the job's strategy uses (the rest would only mislead a comparison)."""
    used = {"fsdp": ["fsdp"], "pipeline": ["pipeline"], "hybrid": ["mesh", "pipeline", "fsdp"]}.get(t.strategy, [])
    return {k: v for k, v in t.parallel.model_dump().items() if k in used}


def flat_params(conf: JobSpec) -> dict[str, Any]:
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


@task(task_run_name="mlflow-start-{job_id}")
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


def job_version(client: MlflowClient, name: str, parent_run_id: str) -> Any | None:
    """The model version a job already registered from its parent run (a re-run must not add another).

    Found by the run it was logged from, not by a tag: a crash between creating the version and tagging
    it must not make the re-run register a second one.
    """
    versions = client.search_model_versions(f"name = '{name}' and run_id = '{parent_run_id}'")
    return min(versions, key=lambda v: int(v.version)) if versions else None


def _log_metrics(client: MlflowClient, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
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
            _log_metrics(client, runs[s], m, step=rnd)
    if rnd not in logged.get("parent", set()):
        _log_metrics(client, runs["parent"], {"sites_in_round": len(result["sites"])}, step=rnd)


def log_async_version(runs: dict[str, str], result: dict[str, Any], logged: dict[str, set[int]] | None = None) -> None:
    """Async mode: one applied global version as a step series (step = version). Each applied update's site
    gets its training numbers and staleness/weight on its child run; the parent gets the version's staleness,
    weight, bytes, the count per site and the refusals so far. Runs that already hold the step are skipped."""
    client = MlflowClient()
    logged = logged or {}
    version = int(result["round"]) + 1
    for s, m in result["site_metrics"].items():
        if s in runs and version not in logged.get(s, set()):
            _log_metrics(client, runs[s], {k: float(v) for k, v in m.items() if isinstance(v, int | float)},
                         step=version)
    if version in logged.get("parent", set()):
        return
    applied = result.get("applied") or []
    stale = [float(e["staleness"]) for e in applied] or [0.0]
    weights = [float(e["weight"]) for e in applied] or [0.0]
    per_site = {f"async_from_{e['site']}": 0.0 for e in applied}
    for e in applied:
        per_site[f"async_from_{e['site']}"] += 1.0
    _log_metrics(client, runs["parent"], {
        "sites_in_round": len(result["sites"]), "async_updates": float(len(applied)),
        "async_staleness": sum(stale) / len(stale), "async_staleness_max": max(stale),
        "async_alpha": sum(weights) / len(weights), "async_update_bytes": float(result.get("update_bytes", 0)),
        "async_refused_total": float(result.get("refused_total", 0)), **per_site}, step=version)


def log_phase_time(run_id: str, name: str, seconds: float) -> None:
    """A phase's wall time on the job's parent run (e.g. ``updates_wall_s``)."""
    _log_metrics(MlflowClient(), run_id, {name: seconds})


def log_validation(runs: dict[str, str], rnd: int, val: RoundValidation, per_site: dict[str, dict[str, Any]],
                   logged: dict[str, set[int]] | None = None) -> None:
    """Global model ``rnd``'s validation: each site's metrics on its child run (``val_*``), the combined ones on
    the parent (``global_val_*``, and ``val_sites``), as step series; each run skips the steps it holds."""
    client = MlflowClient()
    logged = logged or {}
    for s, m in per_site.items():
        numbers = {f"val_{k}": float(v) for k, v in m.items() if isinstance(v, int | float)}
        if s in runs and numbers and rnd not in logged.get(f"validation-{s}", set()):
            _log_metrics(client, runs[s], numbers, step=rnd)
    if rnd not in logged.get("validation", set()):
        _log_metrics(client, runs["parent"], {**{f"global_val_{k}": v for k, v in val.metrics.items()},
                                              "val_sites": float(len(val.sites))}, step=rnd)


@task(task_run_name="register-{job_id}")
def register_model(
    conf: JobSpec,
    job_id: str,
    runs: dict[str, str],
    state: dict[str, torch.Tensor],
    norm: dict[str, Any],
    site_metrics: dict[str, dict[str, float]],
    global_metrics: dict[str, float],
    sites: list[str],
    selection: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Log final metrics, log and register the model, tag its lineage and set alias ``challenger``.

    ``selection`` says which global model this is (``round``, of ``of``, ``reason``, validation ``metric``):
    recorded as tags of the version and the parent run.

    A job registers one version: a re-run of a job that already registered returns that version.
    """
    logger = get_run_logger()
    client = MlflowClient()
    name = conf.training.registry.model_name
    existing = job_version(client, name, runs["parent"])
    if existing is not None:
        version = str(existing.version)
        logger.info("job %s already registered %s version %s; not registering again", job_id, name, version)
        if "gate" in existing.tags:  # judged already: its tags are complete, and `challenger` may have moved on
            return {"model_name": name, "version": version, "alias": "challenger", "run_id": runs["parent"]}
    else:
        version = _log_and_register(conf, runs, state, norm, site_metrics, global_metrics)
    tags = {"job_id": job_id, "dataset": conf.dataset_name, "sites": ",".join(sites),
            "config_hash": conf.config_hash, "code_version": code_version(),
            "features": ",".join(norm["features"])}
    if selection:
        tags.update({"selected_round": str(selection["round"]), "rounds_trained": str(selection["of"]),
                     "selection": str(selection["reason"])[:500], "validation_metric": str(selection["metric"])})
        for k in ("selected_round", "rounds_trained", "selection"):
            client.set_tag(runs["parent"], k, tags[k])
    for k, v in tags.items():
        client.set_model_version_tag(name, version, k, v)
    for k, v in global_metrics.items():
        if not np.isnan(v):
            client.set_model_version_tag(name, version, f"global_test_{k}", f"{v:.6f}")
    gate_metrics = [g.name for g in conf.task.gate_metrics]
    for s, m in site_metrics.items():
        for k in gate_metrics:
            if k in m and not np.isnan(m[k]):
                client.set_model_version_tag(name, version, f"site_{s}_test_{k}", f"{m[k]:.6f}")
    client.set_registered_model_alias(name, "challenger", version)
    logger.info("registered %s version %s, alias challenger", name, version)
    return {"model_name": name, "version": version, "alias": "challenger", "run_id": runs["parent"]}


def _log_and_register(
    conf: JobSpec,
    runs: dict[str, str],
    state: dict[str, torch.Tensor],
    norm: dict[str, Any],
    site_metrics: dict[str, dict[str, float]],
    global_metrics: dict[str, float],
) -> str:
    """Log the test metrics and the model on the job's runs; register it; returns the new version."""
    client = MlflowClient()
    name = conf.training.registry.model_name
    parent_metrics = {f"global_test_{k}": v for k, v in global_metrics.items()}
    for s, m in site_metrics.items():
        _log_metrics(client, runs[s], {f"test_{k}": v for k, v in m.items()})
        parent_metrics.update({f"{s}_test_{k}": v for k, v in m.items()})
    _log_metrics(client, runs["parent"], parent_metrics)
    model = build_model(conf.training.model, len(norm["mean"]), conf.task.n_outputs, Normalization.from_global(norm))
    model.load_state_dict(state)
    model.eval()
    # The input example is the global feature mean: an aggregate, not anyone's row.
    example = np.asarray([norm["mean"]], dtype=np.float32)
    with torch.no_grad():
        out = model(torch.from_numpy(example)).numpy()
    signature = infer_signature(example, out)
    active = mlflow.active_run()
    ctx = nullcontext() if active and active.info.run_id == runs["parent"] else mlflow.start_run(run_id=runs["parent"])
    with ctx:
        # The weights alone, beside the MLflow model: what insitu itself reads back (never the pickle).
        weights = state_to_bytes(state)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / WEIGHTS_FILE).write_bytes(weights)
            client.log_artifact(runs["parent"], str(Path(tmp) / WEIGHTS_FILE), WEIGHTS_DIR)
        info = mlflow.pytorch.log_model(model, name="model", signature=signature, input_example=example,
                                        serialization_format="pickle", registered_model_name=name)
    version = str(info.registered_model_version)
    client.set_model_version_tag(name, version, "weights_sha256", hashlib.sha256(weights).hexdigest())
    return version


@task(task_run_name="load-champion")
def load_champion(conf: JobSpec, features: list[str]) -> dict[str, Any] | None:
    """The current champion's version and weights, if there is one with the same features."""
    logger = get_run_logger()
    client = MlflowClient()
    name = conf.training.registry.model_name
    try:
        mv = client.get_model_version_by_alias(name, "champion")
    except mlflow.exceptions.MlflowException:
        logger.info("no champion of %s yet", name)
        return None
    if mv.tags.get("features") != ",".join(features):
        logger.warning("champion v%s was trained on other features; it cannot be compared", mv.version)
        return None
    state = _read_weights(client, mv)
    if state is None:
        return None
    return {"version": str(mv.version), "state": state}


def _read_weights(client: MlflowClient, mv: Any) -> dict[str, torch.Tensor] | None:
    """A version's weights as tensors only (``torch.load(weights_only=True)``), checked against the SHA-256
    recorded when it was registered. The pickled MLflow model is never loaded: whoever can write an
    artifact or move an alias could otherwise run code on the coordinator."""
    logger = get_run_logger()
    expected = mv.tags.get("weights_sha256")
    if not expected:
        logger.warning("%s v%s has no recorded weights (registered by an older insitu); it is judged by its "
                       "recorded metrics, not re-evaluated", mv.name, mv.version)
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = client.download_artifacts(mv.run_id, f"{WEIGHTS_DIR}/{WEIGHTS_FILE}", tmp)
        data = Path(path).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected:
        raise RuntimeError(f"{mv.name} v{mv.version}: weights SHA-256 {digest[:12]}… differs from the {expected[:12]}… "
                           "recorded at registration; refusing to use them")
    return state_from_bytes(data)


@task(task_run_name="gate-and-promote-{job_id}")
def gate_and_promote(
    conf: JobSpec,
    job_id: str,
    version: str,
    candidate_global: dict[str, float],
    candidate_sites: dict[str, dict[str, float]],
    champion: dict[str, Any] | None,
    champion_global: dict[str, float] | None,
    champion_sites: dict[str, dict[str, float]] | None,
) -> dict[str, Any]:
    """Decide and move the aliases, holding the registry lock so that concurrent jobs stay consistent.

    Inside the lock the current champion is read again; if another job promoted a different version
    since this job evaluated, the candidate is compared with that version's recorded metrics instead.
    """
    from prefect.concurrency.sync import concurrency

    from insitu.gate import comparison_basis, decide, judged, recorded_metrics

    logger = get_run_logger()
    client = MlflowClient()
    name = conf.training.registry.model_name
    gate = conf.training.gate
    metric = conf.task.gate_metric(gate.primary_metric)
    ensure_registry_lock(name)
    with concurrency(registry_lock_name(name), occupy=1, timeout_seconds=600, strict=True):
        try:
            current = client.get_model_version_by_alias(name, "champion")
        except mlflow.exceptions.MlflowException:
            current = None
        before = judged(client.get_model_version(name, version).tags)
        if before is not None:  # a re-run of a job whose version was already judged: the decision stands
            passed, reason = before
            logger.info("%s v%s was already judged (%s): %s", name, version, "passed" if passed else "failed",
                        reason)
            return {"passed": passed, "reason": reason, "primary_metric": metric.name,
                    "candidate": candidate_global, "site_deltas": {}, "version": version, "previous_champion": None,
                    "champion": str(current.version) if current is not None else None}
        evaluated = champion["version"] if champion else None
        basis = comparison_basis(evaluated, str(current.version) if current is not None else None)
        if basis == "recorded":
            logger.warning("champion moved to v%s since this job evaluated v%s; comparing with its recorded "
                           "metrics", current.version, evaluated)
            champion_global, champion_sites = recorded_metrics(current.tags, metric.name)
        elif basis == "none":
            champion_global, champion_sites = None, None
        decision = decide(gate, metric, candidate_global, candidate_sites, champion_global, champion_sites)
        client.set_model_version_tag(name, version, "gate_reason", decision.reason)
        if decision.passed:
            client.set_registered_model_alias(name, "champion", version)
            # The previous champion keeps its version; `challenger` stays on the newest candidate.
        # Written last: a re-run trusts a recorded decision only if everything it implies was done.
        client.set_model_version_tag(name, version, "gate", "passed" if decision.passed else "failed")
    logger.info("gate %s for %s v%s: %s", "PASSED" if decision.passed else "FAILED", name, version,
                decision.reason)
    return {**decision.as_dict(), "version": version,
            "previous_champion": str(current.version) if current is not None else None,
            "champion": version if decision.passed else (str(current.version) if current is not None else None)}


def registry_lock_name(model_name: str) -> str:
    return f"insitu-registry-{model_name}"


def ensure_registry_lock(model_name: str) -> None:
    """The global concurrency limit that serialises gate + alias moves for one registered model.

    Created when first needed (idempotent): a new registry name in a training config must not fail a job
    after training because nobody re-ran ``insitu deploy``.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists

    with get_client(sync_client=True) as client:
        try:
            client.create_global_concurrency_limit(
                GlobalConcurrencyLimitCreate(name=registry_lock_name(model_name), limit=1))
        except ObjectAlreadyExists:
            pass


@task(task_run_name="mlflow-figures")
def log_figures(
    parent_run_id: str, evaluated: dict[str, dict[str, Any]], site_metrics: dict[str, dict[str, float]],
    metric_names: list[str],
) -> None:
    """A per-site metrics bar chart; for a binary task PR curves (per site and global, from score
    histograms), for a multi-class one the global confusion matrix (the sum of the sites')."""
    import matplotlib.pyplot as plt

    from insitu.plots import confusion_figure, pr_curve_figure, site_metrics_figure

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


def finish_runs(runs: dict[str, str], decision: dict[str, Any]) -> None:
    client = MlflowClient()
    client.set_tag(runs["parent"], "gate", "passed" if decision["passed"] else "failed")
    client.set_tag(runs["parent"], "gate_reason", decision["reason"])
    for run_id in runs.values():
        client.set_terminated(run_id, "FINISHED")
