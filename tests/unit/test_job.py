"""``insitu.job``: every component a training config names is resolved once, and a model that cannot be imported
or built fails before anything is signed, in one line naming the file and the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from insitu.conf import ConfigError
from insitu.job import ModelDoesNotFit, load_job


def _set_model(conf: Path, training: str, model: dict[str, object]) -> Path:
    path = conf / "training" / f"{training}.yaml"
    data = yaml.safe_load(path.read_text())
    data["model"] = model
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_job_resolves_each_component_once(conf_dir: Path) -> None:
    job = load_job("fraud", "fraud", conf_dir)
    assert (job.task.name, job.aggregator.name, job.strategy.name) == ("binary", "fedavg", "ddp")
    assert job.model_factory.__name__ == "tabular_mlp" and job.async_algorithm is None
    assert job.config_hash == job.conf.config_hash()
    job.check_model()


def test_a_misspelt_model_import_path_fails_at_load_naming_file_key_and_the_import_error(conf_copy: Path) -> None:
    path = _set_model(conf_copy, "fraud", {"name": "examples.modls:residual_mlp"})
    with pytest.raises(ConfigError) as info:
        load_job("fraud", "fraud", conf_copy)
    message = str(info.value)
    assert message.startswith(f"{path}: key 'model.name': model 'examples.modls:residual_mlp': cannot import")
    assert "ModuleNotFoundError" in message and "\n" not in message


def test_a_model_that_does_not_fit_the_features_fails_check_model(conf_copy: Path) -> None:
    _set_model(conf_copy, "fraud", {"name": "sequence_transformer", "options": {"seq_len": 7}})
    job = load_job("fraud", "fraud", conf_copy)  # the factory imports …
    with pytest.raises(ModelDoesNotFit, match=r"key 'model.name': model 'sequence_transformer'"):
        job.check_model()  # … but its model does not take this dataset's features


def test_validate_reports_a_misspelt_model_once_with_file_and_key(conf_copy: Path) -> None:
    _set_model(conf_copy, "fraud", {"name": "examples.modls:residual_mlp"})
    out = subprocess.run([sys.executable, "-m", "deployments.cli", "validate", "--conf", str(conf_copy)],
                         capture_output=True, text=True, timeout=300, env={"COLUMNS": "400", "PATH": "/usr/bin"},
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 1, out.stdout + out.stderr
    text = " ".join(out.stdout.split())
    assert "key 'model.name': model 'examples.modls:residual_mlp': cannot import" in text
    assert text.count("cannot import") == 1  # the schedule that runs this training points back to it
