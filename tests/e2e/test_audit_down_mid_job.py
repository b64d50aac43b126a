"""A site's audit service stopped in the middle of a job, on the shared platform: the site fails closed (it reads
no data it cannot audit and publishes nothing more), the job fails naming the site and why, and once the service
is started again a re-run by the job id resumes and completes: one model version, each round logged once, the
site's reads of the resumed round in its audit log, and every log verifies against the exchange's anchors."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from platform_helpers import (
    EXCHANGE,
    assert_logged_once,
    assert_trail_verifies,
    coordinator_exchange,
    job_events,
    shipped_training,
    slow_sites,
    start_retrain,
    wait_for_file,
    wait_for_flow_run,
    write_training,
)

from deployments.platform import Platform

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]
ROUNDS = 2
SITE = "us"


def test_a_site_whose_audit_service_is_down_fails_closed_and_the_job_resumes_once_it_is_back(
        deployed: Platform, shared_conf: Path, signer: Any) -> None:
    p = deployed
    model = f"insitu-e2e-auditdown-{uuid.uuid4().hex[:6]}"
    cfg = shipped_training(p.conf_dir, "fraud")
    # every site needed in every round: the job cannot go on without the site that fails closed
    cfg.update(rounds=ROUNDS, local_epochs=1, strategy="single", ranks_per_site=1, registry={"model_name": model})
    cfg["federation"] = {**cfg.get("federation", {}), "min_sites": len(p.sites.names)}
    training = write_training(shared_conf, f"e2e-auditdown-{uuid.uuid4().hex[:6]}", cfg).stem
    job = f"e2e-auditdown-{uuid.uuid4().hex[:6]}"
    params = {"training": training, "dataset": "fraud", "job_id": job, "request": signer(training, job)}
    ex = coordinator_exchange(p)
    root = f"{EXCHANGE}/jobs/{job}"
    others = [s for s in p.sites.names if s != SITE]

    # ---- the site's audit service goes down while the site holds back its round-0 update (its own delay)
    with slow_sites(p, job, {SITE: {"0": 20.0}}):  # type: ignore[dict-item]
        first = start_retrain(params)
        for s in others:
            wait_for_file(ex, f"{root}/update/{s}/round-0000.manifest.json", 600, f"{s} never published round 0")
        os.kill(p.state["pids"][f"audit-{SITE}"], signal.SIGKILL)
        try:
            failed = wait_for_flow_run(first, 600, poll_s=2)
        finally:
            restarted = p.up()["started"]
    assert restarted == [f"audit-{SITE}"], restarted
    assert failed.state.is_failed(), failed.state
    why = failed.state.message or ""
    assert "quorum not met" in why and f"{SITE}'s training run ended" in why and "audit service" in why, why
    (event,) = job_events(p, "coordinator", job, "job.failed")
    assert f"{SITE}'s training run ended" in event["fields"]["reason"], event
    ex.fs.invalidate_cache()
    assert not ex.fs.exists(f"{root}/update/{SITE}/round-0001.manifest.json")  # it trained no further

    # ---- the service is back: a re-run by the job id resumes and completes
    done = wait_for_flow_run(start_retrain({**params, "request": signer(training, job)}), 900, poll_s=2)
    assert done.state.is_completed(), done.state.message
    reads = [e["fields"] for e in job_events(p, SITE, job, "data.read") if e["fields"].get("what") == "prepared/train"]
    assert ROUNDS - 1 in {f["round"] for f in reads}, reads  # the resumed round read, and audited, by the site
    assert_logged_once(p, job, ROUNDS, model)
    assert_trail_verifies(p)
