"""The local platform keeps its data: across ``insitu down`` / ``up``, and across a store killed mid-job.

On the shared platform (everything it holds must come back, so the tests after this one run on a restarted
platform): a shard is put with ``insitu data put``; a job is cancelled after its first round; the platform is
stopped and started again. ``up`` reports every store consistent, the shard and the job's exchange objects are
byte for byte what they were; a different configuration under the job's id is refused; the cancelled job resumes
by its id after its last finished round (its preparation and round 0 reused, not redone; each round logged to
MLflow once, on the same parent run) and registers one version. ``insitu audit verify`` checks every log against
the anchors kept on the exchange, and finds them all. (The exchange's endpoint killed under a running job:
``test_control_plane_faults``.)
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Any

import pytest
from platform_helpers import (
    EXCHANGE,
    assert_logged_once,
    assert_trail_verifies,
    cancel_job,
    coordinator_exchange,
    e2e_name,
    flow_run_logs,
    flow_runs_named,
    shipped_training,
    site_store,
    slow_sites,
    start_retrain,
    wait_for_file,
    wait_for_flow_run,
    write_training,
)

from deployments.cli import audit_verify
from deployments.cli import site_store as data
from deployments.platform import Platform
from deployments.platform.site_side import check_stores
from insitu.storage import Store

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]
MODEL = "insitu-fraud-restart"  # its own registry entry: no other test's gate sees this job's model


def _objects(store: Store, prefix: str) -> dict[str, str]:
    """Every object under ``prefix``: path → SHA-256 of its bytes."""
    store.fs.invalidate_cache()
    return {p: hashlib.sha256(store.fs.cat_file(p)).hexdigest() for p in store.fs.find(prefix)}


def _run(params: dict[str, Any], timeout: float = 900) -> Any:
    return wait_for_flow_run(start_retrain(params), timeout, poll_s=2)


def test_down_up_and_a_killed_store_lose_nothing(deployed: Platform, shared_conf: Path, signer: Any,
                                                tmp_path: Path) -> None:
    cfg = shipped_training(deployed.conf_dir, "fraud")
    # One process per site, one epoch a round; eu holds round 1 open (its publish delayed) so that the first run is
    # cancelled inside it, without training long rounds to get there.
    cfg.update(rounds=2, local_epochs=1, batch_size=32, strategy="single", ranks_per_site=1,
               registry={"model_name": MODEL})
    training = write_training(shared_conf, e2e_name("fraud_restart"), cfg).stem

    def params(job_id: str) -> dict[str, Any]:
        return {"training": training, "dataset": "fraud", "job_id": job_id, "request": signer(training, job_id)}

    # ---- a shard put as a user does (its own bytes back, through `insitu data put`) and a job cancelled
    eu = site_store(deployed, "eu")
    shard = tmp_path / "part-000.parquet"
    shard.write_bytes(eu.fs.cat_file("insitu-eu/raw/fraud/part-000.parquet"))
    data.put(deployed, "eu", shard, "raw/fraud/part-000.parquet")
    first = f"e2e-restart-{uuid.uuid4().hex[:6]}"
    ex = coordinator_exchange(deployed)
    with slow_sites(deployed, first, {"eu": {"1": 120.0}}):  # type: ignore[dict-item]
        run = start_retrain(params(first))
        wait_for_file(ex, f"{EXCHANGE}/jobs/{first}/weights/coordinator/round-0001.manifest.json", 600,
                      "round 0 was never aggregated")
        assert cancel_job(run, first).state.is_cancelled()  # with its site runs, each one final
    job_before = _objects(ex, f"{EXCHANGE}/jobs/{first}/")
    # the premise: the job stopped inside round 1, so the re-run has a round left to train
    assert f"{EXCHANGE}/jobs/{first}/weights/coordinator/round-0002.manifest.json" not in job_before, "round 1 ended"
    assert f"{EXCHANGE}/jobs/{first}/summary/coordinator/summary.json" not in job_before
    eu_before = _objects(eu, "insitu-eu/")
    anchors_before = _objects(ex, f"{EXCHANGE}/anchors/")
    assert job_before and anchors_before

    # ---- down and up: the same objects, every store consistent, nothing re-provisioned
    deployed.down()
    started = deployed.up()["started"]
    deployed.apply_env()
    assert "s3-exchange" in started and "worker-insitu-eu" in started, started
    checks = check_stores(deployed)
    assert [c.store for c in checks] == [*(f"store {s}" for s in deployed.sites.names), "exchange"]
    assert all(c.ok for c in checks), [c.line() for c in checks]
    assert any("shards its audit log says it read are there" in c.detail for c in checks), [c.line() for c in checks]
    assert f"newest job {first}" in checks[-1].detail, checks[-1].line()
    ex, eu = coordinator_exchange(deployed), site_store(deployed, "eu")
    assert _objects(ex, f"{EXCHANGE}/jobs/{first}/") == job_before
    assert _objects(eu, "insitu-eu/") == eu_before
    assert _objects(ex, f"{EXCHANGE}/anchors/").items() >= anchors_before.items()

    # ---- a different configuration under the same job id is refused, and says what to do
    other = _run({**params(first), "rounds": 3, "request": signer(training, first, overrides={"rounds": 3})}, 300)
    assert other.state.is_failed()
    assert "Re-run it with the same training config" in other.state.message, other.state.message

    # ---- the cancelled job resumes by its id: its preparation and round 0 reused, one version registered
    resumed = _run(params(first))
    assert resumed.state.is_completed(), resumed.state.message
    round0 = [p for p in job_before if "/weights/coordinator/round-0001" in p
              or ("/update/" in p and p.endswith("/round-0000.manifest.json"))]
    assert len(round0) >= 4, round0  # the coordinator's global model after round 0, and every site's update
    for path in round0:
        assert hashlib.sha256(ex.fs.cat_file(path)).hexdigest() == job_before[path], f"{path} was rewritten"
    for s in deployed.sites.names:
        logs = flow_run_logs([r.id for r in flow_runs_named(f"site-train-{s}-{first}", exact=True)])
        assert any("round 0 already published by this site" in m for m in logs), s
    assert len(flow_runs_named(f"site-prepare-eu-{first}")) == 1, "the re-run must reuse the job's preparation"
    assert_logged_once(deployed, first, 2, MODEL)  # each round logged once across both attempts, on one parent

    # ---- every log verifies against the anchors the exchange kept, across both restarts
    results = assert_trail_verifies(deployed)
    assert all(r.anchors > 0 for r in results), [(r.actor, r.anchors) for r in results]
    audit_verify(state_dir=deployed.dir, conf=deployed.conf_dir, actor=[], skip_anchors=False)  # the command: exit 0
