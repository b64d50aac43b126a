"""An async job (FedBuff, so the parameter server holds a buffer between versions) cancelled in the middle and
re-run with the same job id resumes: the versions already made stay as they are, the server's state (version,
per-site sequence numbers, buffer) is reloaded, and each version is logged to MLflow exactly once."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient
from platform_helpers import (
    cancel_job,
    coordinator_exchange,
    e2e_name,
    flow_run_logs,
    parent_run,
    shipped_training,
    slow_sites,
    start_retrain,
    wait_for_file,
    wait_for_flow_run,
    write_training,
)

from deployments.platform import Platform

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
MODEL = "insitu-fraud-async-resume"
VERSIONS = 5


def _training_config(directory: Path, conf_dir: Path) -> Path:
    cfg = shipped_training(conf_dir, "fraud")
    cfg.update(rounds=VERSIONS, local_epochs=1, strategy="single", ranks_per_site=1, registry={"model_name": MODEL},
               validation={"select": "last"})
    cfg["federation"] = {"min_sites": 2, "round_deadline_s": 120, "mode": "async",
                         "asynchronous": {"algorithm": "fedbuff", "buffer_size": 2, "alpha": 1.0,
                                          "max_staleness": 10}}
    return write_training(directory, e2e_name("fraud_async_resume"), cfg)


def test_a_cancelled_async_job_resumes_where_it_stopped(deployed: Platform, shared_conf: Path, signer: Any) -> None:
    job_id = f"e2e-async-resume-{uuid.uuid4().hex[:6]}"
    training = _training_config(shared_conf, deployed.conf_dir).stem
    params = {"training": training, "dataset": "fraud", "job_id": job_id, "request": signer(training, job_id)}
    ex = coordinator_exchange(deployed)
    job = f"insitu-exchange/jobs/{job_id}"

    # Every site 3 s per update (its operator's publish delay): slow enough that the job is still running when it
    # is cancelled at version 2.
    with slow_sites(deployed, job_id, {"eu": 3.0, "us": 3.0, "apac": 3.0}):
        # ---- first attempt: cancelled (with its site runs) once version 2 is made
        first = start_retrain(params)
        wait_for_file(ex, f"{job}/weights/coordinator/round-0002.manifest.json", 900, "version 2 was never made")
        assert cancel_job(first, job_id).state.is_cancelled()
        ex.fs.invalidate_cache()
        state = json.loads(ex.fs.cat(f"{job}/control/coordinator/async-state.json"))
        assert state["version"] < VERSIONS, "the job finished before the cancel"
        made = {v: ex.fs.cat(f"{job}/weights/coordinator/round-{v:04d}.manifest.json")
                for v in range(1, state["version"] + 1)}

        # ---- the re-run resumes
        second = wait_for_flow_run(start_retrain(params), 900)
        assert second.state.is_completed(), second.state.message
    ex.fs.invalidate_cache()
    for v, before in made.items():
        assert ex.fs.cat(f"{job}/weights/coordinator/round-{v:04d}.manifest.json") == before, f"version {v} rewritten"
    after = json.loads(ex.fs.cat(f"{job}/control/coordinator/async-state.json"))
    assert after["version"] == VERSIONS and after["decisions"] > state["decisions"]
    assert all(after["next_seq"][s] >= n for s, n in state["next_seq"].items())  # numbering continued
    assert json.loads(ex.fs.cat(f"{job}/control/coordinator/newest.json"))["version"] == VERSIONS
    logs = flow_run_logs([second.id])
    assert any(f"resumed: version {state['version']} of {VERSIONS}" in m for m in logs), logs[:20]

    client = MlflowClient(deployed.mlflow_url)
    versions = [v for v in client.search_model_versions(f"name = '{MODEL}'") if v.tags.get("job_id") == job_id]
    assert len(versions) == 1 and int(versions[0].tags["selected_round"]) == VERSIONS
    parent = parent_run(client, job_id)
    # each version logged exactly once, across both attempts
    steps = [int(m.step) for m in client.get_metric_history(parent.info.run_id, "async_staleness")]
    assert sorted(steps) == list(range(1, VERSIONS + 1)), steps
