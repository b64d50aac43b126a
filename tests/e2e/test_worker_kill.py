"""Kill one rank's Dask worker in the middle of a round of a real ``retrain`` job on the platform.

The site's ``train_round`` task fails (the launch tears the process group down), Prefect retries it, the
retry resumes from the round's newest checkpoint on the site's store, the round completes and the job
registers its model.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from distributed import Client
from mlflow.tracking import MlflowClient
from platform_helpers import (
    coordinator_exchange,
    e2e_name,
    shipped_training,
    site_store,
    start_retrain,
    wait_for_flow_run,
    write_training,
)
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName, TaskRunFilter, TaskRunFilterName

from deployments.platform import Platform
from insitu.conf import load_conf
from insitu.parallel import CheckpointRef
from insitu.parallel.checkpoint import Checkpointer

pytestmark = pytest.mark.e2e
EVERY = 20  # checkpoint interval (steps)


def _training_config(directory: Path, conf_dir: Path) -> Path:
    """The demo config, with one round long enough (~260 steps per site) to be killed in its middle."""
    cfg = shipped_training(conf_dir, "fraud")
    cfg.update(rounds=1, local_epochs=4, batch_size=32, checkpoint={"enabled": True, "every_steps": EVERY})
    # the retry restarts a worker process and re-imports torch: don't let the round's deadline skip eu
    cfg["federation"]["round_deadline_s"] = 900
    return write_training(directory, e2e_name("fraud_kill"), cfg)


def test_killed_rank_worker_round_retries_from_checkpoint_and_job_registers(
    deployed: Platform, shared_conf: Path, signer: Any
) -> None:
    job_id = e2e_name("kill")
    training = _training_config(shared_conf, deployed.conf_dir)
    load_conf(training, "fraud", directory=deployed.conf_dir)  # the config itself is valid
    ckpt = Checkpointer(CheckpointRef(site_store(deployed, "eu"), f"checkpoints/{job_id}/round-0000", EVERY))
    with Client(deployed.dask_address("eu"), timeout=30, security=deployed.dask_security("eu")) as dask:
        pids = dask.run(os.getpid)
    flow_run_id = start_retrain({"training": training.stem, "dataset": "fraud", "job_id": job_id,
                                 "request": signer(training.stem, job_id)})

    # Wait until eu's ranks are well into the round (two checkpoints written), then kill a rank's worker.
    deadline = time.monotonic() + 600
    seen = 0
    while seen < 2 * EVERY:
        assert time.monotonic() < deadline, "eu never reached its second checkpoint"
        with get_client(sync_client=True) as c:
            state = c.read_flow_run(flow_run_id).state
        assert not state.is_final(), f"retrain ended before the kill: {state.type} {state.message}"
        seen = (ckpt.latest() or {}).get("global_step", 0)
        time.sleep(0.1)
    victim = sorted(pids)[1]  # launch puts rank r on the r-th worker (sorted by address); sites have more workers
    os.kill(pids[victim], signal.SIGKILL)  # its nanny starts a fresh worker process
    ex = coordinator_exchange(deployed)
    update = ex.path(f"jobs/{job_id}/update/eu/round-0000.manifest.json")
    assert not ex.fs.exists(update), "eu had finished its round before the kill: nothing was interrupted"

    run = wait_for_flow_run(flow_run_id, 900, poll_s=2)  # retrain finishes after the kill
    assert run.state.is_completed(), run.state.message
    with get_client(sync_client=True) as c:
        (tr,) = c.read_task_runs(
            # eu's one run of the job (it prepared, then trained when the coordinator dispatched it)
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[f"site-prepare-eu-{job_id}"])),
            task_run_filter=TaskRunFilter(name=TaskRunFilterName(any_=["train-eu-round-0"])),
        )
    assert tr.run_count == 2 and tr.state.is_completed(), (tr.run_count, tr.state)

    # The retry resumed from the newest checkpoint, so at most one interval of work was redone.
    ex.fs.invalidate_cache()
    manifest = json.loads(ex.fs.cat(update))
    m = manifest["metrics"]
    assert m["resumed_from_step"] >= seen > 0, (m, seen)
    assert m["steps"] == m["global_steps"] - m["resumed_from_step"]
    other = json.loads(ex.fs.cat(ex.path(f"jobs/{job_id}/update/us/round-0000.manifest.json")))["metrics"]
    assert other["resumed_from_step"] == 0  # the untouched site trained in one go

    client = MlflowClient(deployed.mlflow_url)
    versions = client.search_model_versions("name = 'insitu-fraud'")
    assert any(v.tags.get("job_id") == job_id for v in versions), [v.tags.get("job_id") for v in versions]

