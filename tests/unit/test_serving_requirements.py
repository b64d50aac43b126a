"""A registered model's requirements are written out (tasks.registration.serving_requirements), not inferred at
every registration: they must name every package MLflow's own inference finds for the shipped models."""

from __future__ import annotations

from pathlib import Path

import mlflow.pytorch
import pytest

from insitu.conf import load_conf
from insitu.models import build_model
from tasks.registration import serving_requirements

REPO = Path(__file__).resolve().parents[2]


def _name(requirement: str) -> str:
    return requirement.split("==")[0].strip().lower()


@pytest.mark.parametrize("training", ["fraud"])
def test_the_written_requirements_name_what_mlflows_inference_finds(tmp_path: Path, training: str) -> None:
    conf = load_conf(training, training, REPO / "conf")
    model = build_model(conf.training.model, 12, 1).eval()
    mlflow.pytorch.save_model(model, tmp_path / "inferred", serialization_format="pickle")
    inferred = {_name(r) for r in (tmp_path / "inferred" / "requirements.txt").read_text().splitlines() if r.strip()}
    written = serving_requirements()
    assert {_name(r) for r in written} >= inferred, (written, inferred)
    assert all("+" not in r for r in written), written  # installable from an index: no local version label
    mlflow.pytorch.save_model(model, tmp_path / "written", serialization_format="pickle", pip_requirements=written)
    assert (tmp_path / "written" / "requirements.txt").read_text().splitlines() == written
