"""Re-running a job with the same job id resumes it: finished rounds are reused, not retrained.

A real ``retrain`` job is cancelled (with its site runs, as the UI's "cancel sub flow runs" does) once its
first round is aggregated. A second run with the same ``job_id`` reuses round 0 from the exchange, trains
the rest, and registers one model version, continuing the job's MLflow runs. A re-run under another
configuration is refused with a message that says what to do.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName, LogFilter, LogFilterFlowRunId
from prefect.states import Cancelling

from deployments.platform import Platform
from insitu.storage import Store

pytestmark = pytest.mark.e2e
MODEL = "insitu-fraud-resume"  # its own registry entry: the main e2e job's gate must not see this job's model


def _training_config(directory: Path, conf_dir: Path) -> Path:
    cfg = yaml.safe_load((conf_dir / "training" / "fraud.yaml").read_text())
    # One process per site (cancelling kills it with its flow run); rounds long enough to cancel in round 1.
    cfg.update(rounds=2, local_epochs=20, batch_size=32, strategy="single", ranks_per_site=1,
               registry={"model_name": MODEL})
    path = directory / f"e2e-fraud_resume-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _exchange(p: Platform) -> Store:
    return Store("s3://insitu-exchange/", p.storage_options("exchange", "coordinator"))


def _start(params: dict[str, Any]) -> Any:
    with get_client(sync_client=True) as c:
        dep = c.read_deployment_by_name("retrain/coordinator")
        return c.create_flow_run_from_deployment(dep.id, parameters={"params": params}).id


def _wait(flow_run_id: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as c:
        while not (fr := c.read_flow_run(flow_run_id)).state.is_final():
            assert time.monotonic() < deadline, f"flow run {flow_run_id} not final after {timeout:.0f}s"
            time.sleep(1)
    return fr


def _logs(flow_run_name: str) -> list[str]:
    with get_client(sync_client=True) as c:
        runs = c.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[flow_run_name])))
        return [log.message for log in c.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(
            any_=[r.id for r in runs])))]


def test_rerun_with_the_same_job_id_resumes_after_the_last_finished_round(
    deployed: Platform, shared_conf: Path, signer: Any
) -> None:
    # No ensure_registry_lock(MODEL) here: a registry name nobody deployed gets its lock when first needed.
    job_id = f"e2e-resume-{uuid.uuid4().hex[:6]}"
    training = _training_config(shared_conf, deployed.conf_dir).stem
    params = {"training": training, "dataset": "fraud", "job_id": job_id,
              "request": signer(training, job_id)}
    ex = _exchange(deployed)
    job = f"insitu-exchange/jobs/{job_id}"

    # ---- first attempt: cancelled (with its site runs) once round 0 is aggregated
    first = _start(params)
    deadline = time.monotonic() + 600
    while not ex.fs.exists(f"{job}/weights/coordinator/round-0001.manifest.json"):
        assert time.monotonic() < deadline, "round 0 was never aggregated"
        ex.fs.invalidate_cache()
        time.sleep(0.2)
    with get_client(sync_client=True) as c:
        runs = c.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=job_id)))
        for r in [c.read_flow_run(first), *runs]:
            if not r.state.is_final():
                c.set_flow_run_state(r.id, Cancelling(), force=True)
    assert _wait(first, 300).state.is_cancelled()
    for r in runs:  # no old site run may still be alive when the re-run starts
        _wait(r.id, 300)
    ex.fs.invalidate_cache()
    # the premise: the job stopped inside round 1, so the re-run has a round left to train
    assert not ex.fs.exists(f"{job}/weights/coordinator/round-0002.manifest.json"), "round 1 finished before the cancel"
    round0 = {p: ex.fs.cat(p) for p in [f"{job}/weights/coordinator/round-0001.manifest.json",
                                        *(f"{job}/update/{s}/round-0000.manifest.json" for s in ("eu", "us", "apac"))]}
    assert not ex.fs.exists(f"{job}/summary/coordinator/summary.json")

    # ---- a different configuration under the same job id is refused, and says what to do
    other = _wait(_start({**params, "rounds": 3, "request": signer(training, job_id, overrides={"rounds": 3})}), 300)
    assert other.state.is_failed()
    assert "Re-run it with the same training config" in other.state.message, other.state.message

    # ---- the re-run resumes: round 0 reused, round 1 trained, one model version registered
    second = _wait(_start(params), 900)
    assert second.state.is_completed(), second.state.message
    ex.fs.invalidate_cache()
    for path, before in round0.items():
        assert ex.fs.cat(path) == before, f"{path} was rewritten: round 0 was not reused"
    assert ex.fs.exists(f"{job}/weights/coordinator/round-0002.manifest.json")
    for s in ("eu", "us", "apac"):
        assert any("round 0 already published by this site" in m for m in _logs(f"site-train-{s}-{job_id}")), s
    with get_client(sync_client=True) as c:
        prepares = c.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=f"site-prepare-eu-{job_id}")))
    assert len(prepares) == 1, "the re-run must reuse the job's prepared data, not prepare again"

    client = MlflowClient(deployed.mlflow_url)
    versions = [v for v in client.search_model_versions(f"name = '{MODEL}'") if v.tags.get("job_id") == job_id]
    assert len(versions) == 1, [v.version for v in versions]
    exp = client.get_experiment_by_name("insitu-fraud")
    tagged = client.search_runs([exp.experiment_id], f"tags.job_id = '{job_id}'")
    parents = [r for r in tagged if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1, "the re-run must continue the job's MLflow run, not start another"
    children = [r for r in tagged if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert {r.data.tags["site"] for r in children} == {"eu", "us", "apac"}
    for r in children:  # each round logged exactly once, across both attempts
        assert [m.step for m in client.get_metric_history(r.info.run_id, "train_loss")] == [0, 1]
