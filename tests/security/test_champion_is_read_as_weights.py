"""Whoever can put an artefact behind the `champion` alias must not run code on the coordinator.

A champion whose weights file is a pickle that runs a command, or that has only a pickled MLflow model, is
loaded by the coordinator's own `load_champion` against the real MLflow server: the command never runs.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import uuid
from pathlib import Path
from typing import Any

import mlflow
import pytest
from mlflow.tracking import MlflowClient
from prefect import flow

from deployments.platform import COORDINATOR, Platform
from insitu.job import load_job
from tasks.registration import WEIGHTS_DIR, WEIGHTS_FILE, load_champion

pytestmark = pytest.mark.e2e
FEATURES = ["amount", "hour"]


class _RunsACommand:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


@flow
def _load(conf: Any) -> Any:
    return load_champion(conf, FEATURES)


def _champion(platform: Platform, payload: bytes, record_sha: bool) -> Any:
    """Register a version whose artefacts hold ``payload`` (as the weights and as the pickled model), make it
    champion. Done with the coordinator's account: the one that can move the alias."""
    import hashlib

    name = f"pickle-{uuid.uuid4().hex[:6]}"
    client = MlflowClient(platform.mlflow_url, registry_uri=platform.mlflow_url)
    mlflow.set_tracking_uri(platform.mlflow_url)
    mlflow.set_experiment("security-champion")
    client.create_registered_model(name)
    with mlflow.start_run() as run, tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / WEIGHTS_FILE).write_bytes(payload)
        client.log_artifact(run.info.run_id, str(Path(tmp) / WEIGHTS_FILE), WEIGHTS_DIR)
        (Path(tmp) / "model.pth").write_bytes(payload)
        client.log_artifact(run.info.run_id, str(Path(tmp) / "model.pth"), "model/data")
    mv = client.create_model_version(name, f"runs:/{run.info.run_id}/model", run.info.run_id)
    client.set_model_version_tag(name, mv.version, "features", ",".join(FEATURES))
    if record_sha:
        client.set_model_version_tag(name, mv.version, "weights_sha256", hashlib.sha256(payload).hexdigest())
    client.set_registered_model_alias(name, "champion", mv.version)
    return load_job("fraud", directory=platform.conf_dir, overrides={"registry": {"model_name": name}})


def test_a_pickled_champion_never_runs(platform: Platform, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", COORDINATOR)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", platform.mlflow_password(COORDINATOR))
    marker = tmp_path / "code-ran"
    payload = pickle.dumps({"w": _RunsACommand(marker)})
    # 1. The weights file itself is the pickle (its hash recorded as if registered by insitu): refused.
    with pytest.raises(Exception, match="(?i)weights only|unpickl|unsupported global"):
        _load(_champion(platform, payload, record_sha=True))
    assert not marker.exists()
    # 2. Only a pickled MLflow model, no recorded weights: not loaded at all (judged by recorded metrics).
    assert _load(_champion(platform, payload, record_sha=False)) is None
    assert not marker.exists()
    # the payload is real: unpickling it the way `mlflow.pytorch.load_model` would does run the command
    pickle.loads(payload)  # noqa: S301 (the point of the test)
    assert marker.exists()
