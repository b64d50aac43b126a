"""Two runs of the same job id at once, on the platform: the second is refused at once with a message naming the
running one (rule ``job.one-run-at-a-time``, audited by the coordinator), the first completes and registers one
model version; then a re-run by the job id proceeds (it resumes the finished job)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient
from platform_helpers import job_events, shipped_training, start_retrain, wait_for_flow_run, write_training
from prefect.client.orchestration import get_client

from deployments.platform import Platform
from tasks.job_lease import RULE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]


def _wait_running(flow_run_id: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as c:
        while time.monotonic() < deadline:
            state = c.read_flow_run(flow_run_id).state
            if state is not None and state.is_running():
                return
            assert state is None or not state.is_final(), state
            time.sleep(0.5)
    raise AssertionError(f"flow run {flow_run_id} did not start within {timeout:.0f}s")


def test_a_second_run_of_a_running_job_is_refused_naming_the_first(deployed: Platform, shared_conf: Path,
                                                                    signer: Any) -> None:
    p = deployed
    model = f"insitu-e2e-lease-{uuid.uuid4().hex[:6]}"
    cfg = shipped_training(p.conf_dir, "fraud")
    cfg.update(rounds=1, local_epochs=1, strategy="single", ranks_per_site=1, registry={"model_name": model})
    training = write_training(shared_conf, f"e2e-lease-{uuid.uuid4().hex[:6]}", cfg).stem
    job = f"e2e-lease-{uuid.uuid4().hex[:6]}"
    params = {"training": training, "dataset": "fraud", "job_id": job, "request": signer(training, job)}

    first = start_retrain(params)
    _wait_running(first, 300)
    time.sleep(3)  # past open_job: the first holds the job
    second = start_retrain(params)
    refused = wait_for_flow_run(second, 300)
    assert refused.state is not None and refused.state.is_failed(), refused.state
    assert f"job {job} is already running as flow run {first}" in (refused.state.message or ""), refused.state.message

    done = wait_for_flow_run(first, 900, poll_s=2)
    assert done.state is not None and done.state.is_completed(), done.state
    (event,) = job_events(p, "coordinator", job, "job.refused")
    assert event["fields"]["rule"] == RULE and event["fields"]["running"] == [str(first)]
    assert event["fields"]["flow_run_id"] == str(second)
    assert len(MlflowClient(p.mlflow_url).search_model_versions(f"name = '{model}'")) == 1

    again = wait_for_flow_run(start_retrain({**params, "request": signer(training, job)}), 600, poll_s=2)
    assert again.state is not None and again.state.is_completed(), again.state  # the hold was let go
    assert len(job_events(p, "coordinator", job, "job.refused")) == 1
