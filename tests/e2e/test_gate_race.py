"""Two jobs finishing at once must not leave the registry aliases inconsistent."""

from __future__ import annotations

import contextvars
import threading
import uuid
from typing import Any

import mlflow
import pytest
from mlflow.tracking import MlflowClient
from prefect import flow

from deployments.deploy import ensure_registry_lock
from deployments.platform import Platform
from insitu.gate import Promotion
from insitu.job import load_job
from tasks.promotion import gate_and_promote
from tasks.registration import Champion

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
def as_coordinator(platform: Platform, monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests play the coordinator's registry step: only its service account may write the registry."""
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "coordinator")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", platform.mlflow_password("coordinator"))


def _version(client: MlflowClient, name: str, pr_auc: float) -> str:
    with mlflow.start_run() as run:
        mlflow.log_text("weights would be here", "model/README.txt")
    mv = client.create_model_version(name, f"runs:/{run.info.run_id}/model", run.info.run_id)
    client.set_model_version_tag(name, mv.version, "global_test_pr_auc", str(pr_auc))
    client.set_model_version_tag(name, mv.version, "site_eu_test_pr_auc", str(pr_auc))
    return str(mv.version)


@flow
def promote(conf: Any, version: str, pr_auc: float, champion_version: str) -> Promotion:
    # Both candidates were evaluated against the same (soon stale) champion, v1 at PR-AUC 0.30.
    return gate_and_promote(conf, f"job-{version}", version, {"pr_auc": pr_auc}, {"eu": {"pr_auc": pr_auc}},
                            Champion(champion_version, {}), {"pr_auc": 0.30}, {"eu": {"pr_auc": 0.30}})


def _setup(platform: Platform) -> tuple[Any, MlflowClient, str, str, str, str]:
    name = f"race-{uuid.uuid4().hex[:6]}"
    ensure_registry_lock(name)
    conf = load_job("fraud", directory=platform.conf_dir, overrides={"registry": {"model_name": name}})
    client = MlflowClient(platform.mlflow_url)
    mlflow.set_tracking_uri(platform.mlflow_url)
    mlflow.set_experiment("gate-race")  # its own (the coordinator may write only what it created)
    client.create_registered_model(name)
    v1 = _version(client, name, 0.30)
    client.set_registered_model_alias(name, "champion", v1)
    return conf, client, name, v1, _version(client, name, 0.50), _version(client, name, 0.40)


def test_stale_candidate_is_judged_against_the_new_champion(platform: Platform) -> None:
    conf, client, name, v1, better, worse = _setup(platform)
    assert promote(conf, better, 0.50, v1).passed
    d = promote(conf, worse, 0.40, v1)  # it beat v1, but v(better) is champion now
    assert not d.passed and d.previous_champion == better
    assert client.get_model_version_by_alias(name, "champion").version == better
    assert client.get_model_version(name, worse).tags["gate"] == "failed"
    # a re-run of the worse job (same version) keeps the recorded decision, even with other numbers
    again = promote(conf, worse, 0.99, v1)
    assert not again.passed and client.get_model_version_by_alias(name, "champion").version == better


def test_concurrent_promotions_leave_the_best_as_champion(platform: Platform) -> None:
    for _ in range(2):
        conf, client, name, v1, better, worse = _setup(platform)
        results: dict[str, Promotion] = {}

        def run(conf: Any, v: str, m: float, v1: str, results: dict[str, Promotion]) -> None:
            results[v] = promote(conf, v, m, v1)

        # Each thread gets a copy of this context, so it sees the platform's Prefect settings.
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(run, conf, v, m, v1, results))
                   for v, m in ((worse, 0.40), (better, 0.50))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert set(results) == {better, worse}
        assert client.get_model_version_by_alias(name, "champion").version == better
        assert results[better].passed
