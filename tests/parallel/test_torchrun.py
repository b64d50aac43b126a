"""The same training entry point runs under plain torchrun (how a user debugs a site's training)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from toy_site import write_train_split

REPO = Path(__file__).resolve().parents[2]


def test_torchrun_two_ranks_trains_and_saves(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(600, 6)).astype(np.float32)
    write_train_split(tmp_path / "store", x, (x[:, 0] > 1).astype(np.float32), dataset="fraud", job="dbg")
    out = tmp_path / "state.pt"
    torchrun = str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "insitu.parallel.run",
         "--config", str(REPO / "conf/training/fraud.yaml"), "--data", f"file://{tmp_path / 'store'}/",
         "--job-id", "dbg", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trained on 600 rows with 2 ranks" in proc.stderr
    state = torch.load(out, weights_only=True)
    assert state["core.0.weight"].shape[1] == 6


@pytest.mark.parametrize(("strategy", "parallel"), [
    ("fsdp", {}),
    ("pipeline", {"pipeline": {"schedule": "gpipe", "microbatches": 2}}),
    ("hybrid", {"mesh": {"dp_replicate": 1, "dp_shard": 2}}),
])
def test_torchrun_runs_every_strategy(tmp_path: Path, strategy: str, parallel: dict[str, object]) -> None:
    """The sharded and pipelined strategies run under plain torchrun too, from a user's own config file."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(256, 6)).astype(np.float32)
    write_train_split(tmp_path / "store", x, (x[:, 0] > 1).astype(np.float32), dataset="fraud", job="dbg")
    cfg = yaml.safe_load((REPO / "conf/training/fraud.yaml").read_text())
    cfg.update({"strategy": strategy, "ranks_per_site": 2, "batch_size": 64, "parallel": parallel,
                "model": {"name": "tabular_mlp", "hidden": [16, 16], "dropout": 0.0}})
    config = tmp_path / "mine.yaml"
    config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "state.pt"
    torchrun = str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "insitu.parallel.run", "--config", str(config),
         "--conf-dir", str(REPO / "conf"), "--data", f"file://{tmp_path / 'store'}/", "--job-id", "dbg",
         "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trained on 256 rows with 2 ranks" in proc.stderr
    state = torch.load(out, weights_only=True)
    # the whole model on rank 0, whatever the strategy split or sharded
    assert state["core.0.weight"].shape == (16, 6) and state["core.6.weight"].shape == (1, 16)
