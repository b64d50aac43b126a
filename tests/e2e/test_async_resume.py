"""An async job (FedBuff, so the parameter server holds a buffer between versions) cancelled in the middle and
re-run with the same job id resumes: the versions already made stay as they are, the server's state (version,
per-site sequence numbers, buffer) is reloaded, and each version is logged to MLflow exactly once."""

from __future__ import annotations

import json
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

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
MODEL = "insitu-fraud-async-resume"
VERSIONS = 5


def _training_config(directory: Path, conf_dir: Path) -> Path:
    cfg = yaml.safe_load((conf_dir / "training" / "fraud.yaml").read_text())
    # Every site 3 s per update: slow enough that the job is still running when it is cancelled at version 2.
    cfg.update(rounds=VERSIONS, local_epochs=1, strategy="single", ranks_per_site=1, registry={"model_name": MODEL},
               validation={"select": "last"})
    cfg["federation"] = {"min_sites": 2, "round_deadline_s": 120, "mode": "async",
                         "simulated_delay_s": {"eu": 3.0, "us": 3.0, "apac": 3.0},
                         "asynchronous": {"algorithm": "fedbuff", "buffer_size": 2, "alpha": 1.0,
                                          "max_staleness": 10}}
    path = directory / f"e2e-fraud_async_resume-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


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


def _logs(flow_run_id: Any) -> list[str]:
    with get_client(sync_client=True) as c:
        return [log.message for log in c.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(
            any_=[flow_run_id])))]


def test_a_cancelled_async_job_resumes_where_it_stopped(deployed: Platform, shared_conf: Path, signer: Any) -> None:
    job_id = f"e2e-async-resume-{uuid.uuid4().hex[:6]}"
    training = _training_config(shared_conf, deployed.conf_dir).stem
    params = {"training": training, "dataset": "fraud", "job_id": job_id, "request": signer(training, job_id)}
    ex = Store("s3://insitu-exchange/", deployed.storage_options("exchange", "coordinator"))
    job = f"insitu-exchange/jobs/{job_id}"

    # ---- first attempt: cancelled (with its site runs) once version 2 is made
    first = _start(params)
    deadline = time.monotonic() + 900
    while not ex.fs.exists(f"{job}/weights/coordinator/round-0002.manifest.json"):
        assert time.monotonic() < deadline, "version 2 was never made"
        ex.fs.invalidate_cache()
        time.sleep(0.2)
    with get_client(sync_client=True) as c:
        runs = c.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=job_id)))
        for r in [c.read_flow_run(first), *runs]:
            if not r.state.is_final():
                c.set_flow_run_state(r.id, Cancelling(), force=True)
    assert _wait(first, 300).state.is_cancelled()
    for r in runs:
        _wait(r.id, 300)
    ex.fs.invalidate_cache()
    state = json.loads(ex.fs.cat(f"{job}/control/coordinator/async-state.json"))
    assert state["version"] < VERSIONS, "the job finished before the cancel"
    made = {v: ex.fs.cat(f"{job}/weights/coordinator/round-{v:04d}.manifest.json")
            for v in range(1, state["version"] + 1)}

    # ---- the re-run resumes
    second = _wait(_start(params), 900)
    assert second.state.is_completed(), second.state.message
    ex.fs.invalidate_cache()
    for v, before in made.items():
        assert ex.fs.cat(f"{job}/weights/coordinator/round-{v:04d}.manifest.json") == before, f"version {v} rewritten"
    after = json.loads(ex.fs.cat(f"{job}/control/coordinator/async-state.json"))
    assert after["version"] == VERSIONS and after["decisions"] > state["decisions"]
    assert all(after["next_seq"][s] >= n for s, n in state["next_seq"].items())  # numbering continued
    assert json.loads(ex.fs.cat(f"{job}/control/coordinator/newest.json"))["version"] == VERSIONS
    logs = _logs(second.id)
    assert any(f"resumed: version {state['version']} of {VERSIONS}" in m for m in logs), logs[:20]

    client = MlflowClient(deployed.mlflow_url)
    versions = [v for v in client.search_model_versions(f"name = '{MODEL}'") if v.tags.get("job_id") == job_id]
    assert len(versions) == 1 and int(versions[0].tags["selected_round"]) == VERSIONS
    exp = client.get_experiment_by_name("insitu-fraud")
    (parent,) = [r for r in client.search_runs([exp.experiment_id], f"tags.job_id = '{job_id}'")
                 if "mlflow.parentRunId" not in r.data.tags]
    # each version logged exactly once, across both attempts
    steps = [int(m.step) for m in client.get_metric_history(parent.info.run_id, "async_staleness")]
    assert sorted(steps) == list(range(1, VERSIONS + 1)), steps
