"""DCP checkpoints: a run interrupted mid-epoch resumes and ends exactly where an uninterrupted one does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from insitu.conf import TrainingConfig
from insitu.models import build_model
from insitu.parallel.checkpoint import Checkpointer
from insitu.parallel.loop import train_epochs
from insitu.parallel.types import CheckpointRef
from insitu.specs import task_for_label
from insitu.storage import Store

CFG = TrainingConfig.model_validate({"model": {"hidden": [8], "dropout": 0.0}, "optimizer": {"name": "adam",
                                     "lr": 0.01}, "batch_size": 32, "local_epochs": 2})
LOSS = task_for_label().loss({"pos_weight": 2.0})


class Crash(RuntimeError):
    pass


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(320, 5)).astype(np.float32)
    return x, (x[:, 0] > 0.5).astype(np.float32)


def _fresh() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(CFG.model, 5)


def test_resume_after_a_crash_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    x, y = _data()
    straight = _fresh()
    ref_metrics = train_epochs(straight, x, y, CFG, LOSS, seed=1)

    ckpt = Checkpointer(CheckpointRef(Store(f"file://{tmp_path}/", {}), "checkpoints/job/round-0000", every_steps=4))

    def crash_at_14(m: dict[str, float]) -> None:
        if m["step"] == 14:
            raise Crash("rank died")

    with pytest.raises(Crash):
        train_epochs(_fresh(), x, y, CFG, LOSS, seed=1, on_step=crash_at_14, checkpointer=ckpt)
    latest = ckpt.latest()
    assert latest == {"epoch": 1, "batch": 2, "global_step": 12, "path": "checkpoints/job/round-0000/step-00000012"}
    # only the newest checkpoint is kept
    assert [p.name for p in (tmp_path / "checkpoints/job/round-0000").iterdir() if p.is_dir()] == ["step-00000012"]

    resumed = _fresh()
    metrics = train_epochs(resumed, x, y, CFG, LOSS, seed=1, checkpointer=ckpt)
    assert metrics["resumed_from_step"] == 12
    assert metrics["global_steps"] == ref_metrics["global_steps"] == 20
    assert metrics["steps"] == 8  # the lost work was steps 13-14, redone: at most one interval
    for k, v in straight.state_dict().items():
        assert torch.allclose(resumed.state_dict()[k], v, atol=1e-6), k
