""""One file plus its test" per seam, proven: a copy of the package gets one new file per seam — a learning task, a
model, an aggregator and an in-site strategy — and a job naming all four loads, builds its model, trains a round
and aggregates, with no other file edited."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SEAMS = Path(__file__).parent / "seams"

# seam file in the package → the dummy that goes there
DUMMIES = {
    "insitu/specs/dummy_binary.py": "dummy_binary.py",
    "insitu/models/dummy_linear.py": "dummy_linear.py",
    "insitu/federated/aggregators/dummy_first.py": "dummy_first.py",
    "insitu/parallel/dummy_single.py": "dummy_single.py",
}

TRAINING = """
task: dummy_binary
model: {name: dummy_linear}
aggregator: dummy_first
strategy: dummy_single
rounds: 1
batch_size: 32
optimizer: {name: sgd, lr: 0.1}
registry: {model_name: dummy}
"""


def test_a_new_task_model_aggregator_and_strategy_are_one_file_each(tmp_path: Path) -> None:
    shutil.copytree(REPO / "insitu", tmp_path / "insitu", ignore=shutil.ignore_patterns("__pycache__", "*_test.py"))
    for target, source in DUMMIES.items():
        shutil.copy(SEAMS / source, tmp_path / target)
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf, ignore=shutil.ignore_patterns("e2e-*", ".e2e-*"))  # the e2e tests' own
    (conf / "training" / "dummy.yaml").write_text(TRAINING)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(SEAMS / "run_dummy_job.py"), str(conf), str(tmp_path / "store")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["package"] == str(tmp_path / "insitu" / "__init__.py")  # the copy, not the checkout
    assert result["resolved"] == ["dummy_binary", "dummy_linear", "dummy_first", "dummy_single"]
    assert result["parallelize_calls"] == 1  # the dummy strategy wrapped the model that trained
    assert result["steps"] > 0 and result["trained_changed_weights"]
    assert result["aggregate_is_first_update"]  # the dummy aggregator's rule decided the global model


def test_the_dummies_are_not_in_the_package() -> None:
    for target in DUMMIES:
        assert not (REPO / target).exists()
