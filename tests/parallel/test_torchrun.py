"""The same DDP entry point runs under plain torchrun (how a user debugs a site's training)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from insitu.data.prepare import prepared_prefix

REPO = Path(__file__).resolve().parents[2]


def test_torchrun_two_ranks_trains_and_saves(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    d = tmp_path / "store" / prepared_prefix("fraud", "dbg") / "train"
    d.mkdir(parents=True)
    x = rng.normal(size=(600, 6)).astype(np.float32)
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(6)])
    frame["label"] = (x[:, 0] > 1).astype(np.float32)
    frame.to_parquet(d / "s0.parquet", index=False)
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
