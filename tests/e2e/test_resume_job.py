"""Re-running a job with the same job id resumes it: finished rounds are reused, not retrained.

A real ``retrain`` job is cancelled (with its site runs, as the UI's "cancel sub flow runs" does) once its
first round is aggregated. A second run with the same ``job_id`` reuses round 0 from the exchange, trains
the rest, and registers one model version, continuing the job's MLflow runs. A re-run under another
configuration is refused with a message that says what to do.
"""

from __future__ import annotations

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
    flow_runs_named,
    shipped_training,
    start_retrain,
    wait_for_file,
    wait_for_flow_run,
    write_training,
)

from deployments.platform import Platform

pytestmark = pytest.mark.e2e
MODEL = "insitu-fraud-resume"  # its own registry entry: the main e2e job's gate must not see this job's model


def _training_config(directory: Path, conf_dir: Path) -> Path:
    cfg = shipped_training(conf_dir, "fraud")
    # One process per site (cancelling kills it with its flow run); rounds long enough to cancel in round 1.
    cfg.update(rounds=2, local_epochs=20, batch_size=32, strategy="single", ranks_per_site=1,
               registry={"model_name": MODEL})
    return write_training(directory, e2e_name("fraud_resume"), cfg)


def test_rerun_with_the_same_job_id_resumes_after_the_last_finished_round(
    deployed: Platform, shared_conf: Path, signer: Any
) -> None:
    # No ensure_registry_lock(MODEL) here: a registry name nobody deployed gets its lock when first needed.
    job_id = f"e2e-resume-{uuid.uuid4().hex[:6]}"
    training = _training_config(shared_conf, deployed.conf_dir).stem
    params = {"training": training, "dataset": "fraud", "job_id": job_id,
              "request": signer(training, job_id)}
    ex = coordinator_exchange(deployed)
    job = f"insitu-exchange/jobs/{job_id}"

    # ---- first attempt: cancelled (with its site runs) once round 0 is aggregated
    first = start_retrain(params)
    wait_for_file(ex, f"{job}/weights/coordinator/round-0001.manifest.json", 600, "round 0 was never aggregated")
    assert cancel_job(first, job_id).state.is_cancelled()  # with its site runs, each one final
    ex.fs.invalidate_cache()
    # the premise: the job stopped inside round 1, so the re-run has a round left to train
    assert not ex.fs.exists(f"{job}/weights/coordinator/round-0002.manifest.json"), "round 1 finished before the cancel"
    round0 = {p: ex.fs.cat(p) for p in [f"{job}/weights/coordinator/round-0001.manifest.json",
                                        *(f"{job}/update/{s}/round-0000.manifest.json" for s in ("eu", "us", "apac"))]}
    assert not ex.fs.exists(f"{job}/summary/coordinator/summary.json")

    # ---- a different configuration under the same job id is refused, and says what to do
    other = wait_for_flow_run(start_retrain({**params, "rounds": 3,
                                             "request": signer(training, job_id, overrides={"rounds": 3})}), 300)
    assert other.state.is_failed()
    assert "Re-run it with the same training config" in other.state.message, other.state.message

    # ---- the re-run resumes: round 0 reused, round 1 trained, one model version registered
    second = wait_for_flow_run(start_retrain(params), 900)
    assert second.state.is_completed(), second.state.message
    ex.fs.invalidate_cache()
    for path, before in round0.items():
        assert ex.fs.cat(path) == before, f"{path} was rewritten: round 0 was not reused"
    assert ex.fs.exists(f"{job}/weights/coordinator/round-0002.manifest.json")
    for s in ("eu", "us", "apac"):
        logs = flow_run_logs([r.id for r in flow_runs_named(f"site-train-{s}-{job_id}", exact=True)])
        assert any("round 0 already published by this site" in m for m in logs), s
    prepares = flow_runs_named(f"site-prepare-eu-{job_id}")
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
