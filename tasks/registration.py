"""MLflow's model registry: register a job's model version, and read the champion's weights back.

A version carries its signature, lineage tags and test metrics, and the alias ``challenger``; whether it becomes
``champion`` is the gate's decision (``tasks/promotion.py``). The champion is read back as weights only, checked
against the hash recorded at registration, never unpickled.
"""

from __future__ import annotations

import hashlib
import tempfile
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch
from mlflow.entities.model_registry import ModelVersion
from mlflow.models import infer_signature
from mlflow.tracking import MlflowClient
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from insitu.federated.exchange import state_from_bytes, state_to_bytes
from insitu.gate import metric_tags
from insitu.job import JobSpec
from insitu.models import Normalization, build_model
from tasks.mlflow_runs import code_version, log_metrics

# What a registered model needs to load and serve: the packages MLflow's own inference finds for it (its pytorch
# flavour's, the data libraries its pyfunc wrapper uses, and insitu, whose classes the pickled model names).
SERVING_PACKAGES = ("mlflow", "cloudpickle", "insitu", "numpy", "pandas", "torch")
WEIGHTS_DIR = "weights"
WEIGHTS_FILE = "state.pt"


@dataclass(frozen=True)
class Registration:
    """A model version a job registered, the alias it holds, and the job's parent run it was logged from."""

    model_name: str
    version: str
    alias: str
    run_id: str

    def as_dict(self) -> dict[str, str]:
        """The fields as the audit entry ``model.registered`` and the job summary record them."""
        return asdict(self)


@dataclass(frozen=True)
class Champion:
    """The version holding the ``champion`` alias and its weights (tensors only)."""

    version: str
    state: dict[str, torch.Tensor]


def job_version(client: MlflowClient, name: str, parent_run_id: str) -> ModelVersion | None:
    """The model version a job already registered from its parent run (a re-run must not add another).

    Found by the run it was logged from, not by a tag: a crash between creating the version and tagging
    it must not make the re-run register a second one.
    """
    versions = client.search_model_versions(f"name = '{name}' and run_id = '{parent_run_id}'")
    return min(versions, key=lambda v: int(v.version)) if versions else None


@task(cache_policy=NO_CACHE, task_run_name="register-{job_id}")
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
) -> Registration:
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
            return Registration(name, version, "challenger", runs["parent"])
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
    tags.update(metric_tags(global_metrics, site_metrics, [g.name for g in conf.task.gate_metrics]))
    for k, v in tags.items():
        client.set_model_version_tag(name, version, k, v)
    client.set_registered_model_alias(name, "challenger", version)
    logger.info("registered %s version %s, alias challenger", name, version)
    return Registration(name, version, "challenger", runs["parent"])


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
        log_metrics(client, runs[s], {f"test_{k}": v for k, v in m.items()})
        parent_metrics.update({f"{s}_test_{k}": v for k, v in m.items()})
    log_metrics(client, runs["parent"], parent_metrics)
    model = build_model(conf.training.model, len(norm["mean"]), conf.task.n_outputs, Normalization.from_global(norm))
    model.load_state_dict(state)
    model.output_link = conf.task.output_link  # a Poisson model serves counts, not log-rates
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
                                        serialization_format="pickle", registered_model_name=name,
                                        pip_requirements=serving_requirements())
    version = str(info.registered_model_version)
    client.set_model_version_tag(name, version, "weights_sha256", hashlib.sha256(weights).hexdigest())
    return version


def serving_requirements() -> list[str]:
    """The registered model's ``requirements.txt``, pinned to what is installed (a local version label such as
    torch's ``+cpu`` dropped, as MLflow does, so that pip can install it). Written out rather than inferred: MLflow's
    inference starts a Python process that imports mlflow, torch and the model to see what it imports, 9-14 s on the
    coordinator's path at every registration on 2 cores (0.2 s so); ``tests/unit/test_serving_requirements.py``
    checks that it names what the inference finds."""
    return [f"{name}=={installed_version(name).split('+')[0]}" for name in SERVING_PACKAGES]


@task(cache_policy=NO_CACHE, task_run_name="load-champion")
def load_champion(conf: JobSpec, features: list[str]) -> Champion | None:
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
    return Champion(str(mv.version), state)


def _read_weights(client: MlflowClient, mv: ModelVersion) -> dict[str, torch.Tensor] | None:
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
