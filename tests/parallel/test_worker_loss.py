"""Kill one rank's Dask worker mid-training: the launch fails fast, the retry resumes from the checkpoint."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from distributed import Client
from toy_site import local_cluster, write_train_split

from insitu.conf import TrainingConfig
from insitu.models import build_model
from insitu.parallel import CheckpointRef, DataRef, TrainSpec
from insitu.parallel.checkpoint import Checkpointer
from insitu.parallel.launch import RankFailed
from insitu.parallel.site import train_site
from insitu.specs import task_for_label

EVERY = 20


def test_killed_worker_round_resumes_from_last_checkpoint(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4000, 6)).astype(np.float32)
    write_train_split(tmp_path, x, (x[:, 0] > 1).astype(np.float32))
    cfg = TrainingConfig.model_validate({"model": {"hidden": [32], "dropout": 0.0}, "batch_size": 16,
                                         "local_epochs": 12, "strategy": "ddp", "ranks_per_site": 2})
    store_url = f"file://{tmp_path}/"
    from insitu.storage import Store

    store = Store(store_url, {})
    ref = CheckpointRef(store, "checkpoints/job/round-0000", EVERY)
    torch.manual_seed(0)
    spec = TrainSpec(cfg, task_for_label(), 6, build_model(cfg.model, 6).state_dict(), DataRef(store, "toy", "job"),
                     {"pos_weight": 2.0}, 5, ref)
    with local_cluster(2) as address, Client(address) as client:
        pids = client.run(os.getpid)
        errors: list[BaseException] = []

        def first_attempt() -> None:
            try:
                train_site(spec, address)
            except BaseException as e:  # noqa: BLE001 (recorded for the assertion)
                errors.append(e)

        t = threading.Thread(target=first_attempt)
        t.start()
        ckpt = Checkpointer(ref)
        deadline = time.monotonic() + 120
        while (ckpt.latest() or {}).get("global_step", 0) < 2 * EVERY:
            assert time.monotonic() < deadline and t.is_alive(), f"no checkpoint before the run ended: {errors}"
            time.sleep(0.05)
        seen = ckpt.latest()["global_step"]
        victim = sorted(pids)[-1]
        os.kill(pids[victim], signal.SIGKILL)  # the nanny restarts it
        t.join(timeout=180)
        assert errors and isinstance(errors[0], RankFailed), errors
        assert not psutil.pid_exists(pids[victim]) or psutil.Process(pids[victim]).status() == "zombie"

        result = train_site(spec, address)  # what the Prefect task's retry does
    steps_per_epoch = (4000 // 2) // (16 // 2)
    assert result.metrics["resumed_from_step"] >= seen
    assert result.metrics["global_steps"] == steps_per_epoch * 12
    # lost work: at most one checkpoint interval was redone
    assert result.metrics["steps"] <= steps_per_epoch * 12 - seen
    assert result.n_samples == 4000


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)
