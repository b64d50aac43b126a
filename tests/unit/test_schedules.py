"""Schedules declared per dataset in ``datasets.yaml``: what the config admits, what ``insitu validate`` checks,
and the Prefect schedules ``insitu deploy`` puts on ``retrain/coordinator``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from deployments.cli import check_schedule, validate
from deployments.deploy import retrain_schedule, retrain_schedules
from insitu.conf import ConfigError, DatasetsConfig, ScheduleConfig, load_conf, load_datasets

WEEKLY = {"cron": "0 3 * * 1", "timezone": "Europe/Berlin", "training": "fraud", "active": True}


@pytest.fixture
def conf(conf_copy: Path) -> Path:
    """A private copy of the fixture ``conf/`` whose schedules a test may rewrite."""
    return conf_copy


def _with_schedules(conf: Path, schedules: list[dict[str, Any]], dataset: str = "fraud") -> Path:
    path = conf / "datasets.yaml"
    data = yaml.safe_load(path.read_text())
    data["datasets"][dataset]["schedules"] = schedules
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _error(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_datasets(path)
    return str(info.value)


def _with_min_sites(training_yaml: str, n: int) -> str:
    data = yaml.safe_load(training_yaml)
    data.setdefault("federation", {})["min_sites"] = n
    return yaml.safe_dump(data, sort_keys=False)


def _dataset(conf: Path) -> dict[str, Any]:
    """The fraud dataset of ``conf`` without its schedules."""
    raw = yaml.safe_load((conf / "datasets.yaml").read_text())["datasets"]["fraud"]
    return {k: v for k, v in raw.items() if k != "schedules"}


# --------------------------------------------------------------------------- the config
def test_a_schedule_loads_as_written(conf_dir: Path) -> None:
    (s,) = load_datasets(conf_dir / "datasets.yaml").datasets["fraud"].schedules  # fraud, weekly
    assert s.model_dump() == WEEKLY


def test_defaults_utc_and_active_and_one_spelling_of_the_cron(conf: Path) -> None:
    path = _with_schedules(conf, [{"cron": " 0  3 * *\t1 ", "training": "fraud_single"}])
    (s,) = load_datasets(path).datasets["fraud"].schedules
    assert (s.cron, s.timezone, s.active, s.training) == ("0 3 * * 1", "UTC", True, "fraud_single")


def test_a_dataset_without_schedules_has_none(conf: Path) -> None:
    path = conf / "datasets.yaml"
    data = yaml.safe_load(path.read_text())
    del data["datasets"]["fraud"]["schedules"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert load_datasets(path).datasets["fraud"].schedules == []


@pytest.mark.parametrize("cron", ["0 3 * *", "0 3 * * 1 2026", "@weekly", ""])
def test_a_cron_needs_five_fields(conf: Path, cron: str) -> None:
    msg = _error(_with_schedules(conf, [{**WEEKLY, "cron": cron}]))
    assert "key 'datasets.fraud.schedules[0].cron'" in msg and "five fields" in msg and "0 3 * * 1" in msg, msg


@pytest.mark.parametrize("tz", ["europe/berlin", "Mars/Olympus_Mons", "CEST", "../../etc/passwd"])
def test_a_timezone_is_an_iana_name(conf: Path, tz: str) -> None:
    msg = _error(_with_schedules(conf, [{**WEEKLY, "timezone": tz}]))
    assert "key 'datasets.fraud.schedules[0].timezone'" in msg and "IANA" in msg and "Europe/Berlin" in msg, msg


def test_a_schedule_names_its_training(conf: Path) -> None:
    msg = _error(_with_schedules(conf, [{"cron": "0 3 * * 1"}]))
    assert "key 'datasets.fraud.schedules[0].training': required key is missing" in msg, msg
    msg = _error(_with_schedules(conf, [{**WEEKLY, "training": "../fraud"}]))
    assert "key 'datasets.fraud.schedules[0].training'" in msg, msg


def test_an_unknown_key_in_a_schedule_lists_the_known_ones(conf: Path) -> None:
    msg = _error(_with_schedules(conf, [{**WEEKLY, "paused": True}]))
    assert "key 'datasets.fraud.schedules[0].paused': unknown key" in msg, msg
    assert "cron, timezone, training, active" in msg, msg


def test_the_same_schedule_twice_is_refused(conf: Path) -> None:
    msg = _error(_with_schedules(conf, [WEEKLY, {**WEEKLY, "active": False}]))
    assert "key 'datasets.fraud.schedules[1]': repeats schedules[0]" in msg, msg
    # The same time for another training is two different jobs.
    load_datasets(_with_schedules(conf, [WEEKLY, {**WEEKLY, "training": "fraud_single"}]))


def test_editing_a_schedule_does_not_change_the_config_hash(conf: Path) -> None:
    before = load_conf("fraud", directory=conf).config_hash()
    _with_schedules(conf, [{**WEEKLY, "cron": "30 1 * * *"}])
    assert load_conf("fraud", directory=conf).config_hash() == before


# --------------------------------------------------------------------------- insitu validate
def test_validate_accepts_a_schedule_of_a_training_that_loads(conf_dir: Path) -> None:
    (s,) = load_datasets(conf_dir / "datasets.yaml").datasets["fraud"].schedules
    check_schedule(conf_dir, "fraud", 0, s)


def test_validate_refuses_a_schedule_of_an_unknown_training(conf: Path) -> None:
    with pytest.raises(ConfigError) as info:
        check_schedule(conf, "fraud", 2, ScheduleConfig(cron="0 3 * * 1", training="fraud_v2"))
    msg = str(info.value)
    assert f"{conf / 'datasets.yaml'}: key 'datasets.fraud.schedules[2].training'" in msg, msg
    assert "fraud_v2.yaml" in msg and "['card_sequences', 'digits', 'fraud', 'fraud_single']" in msg, msg


def test_validate_refuses_a_training_that_does_not_load_with_the_dataset(conf: Path) -> None:
    # Four sites' quorum on a dataset held by three: the training loads alone, not with this dataset.
    text = (conf / "training" / "fraud.yaml").read_text()
    (conf / "training" / "quorum4.yaml").write_text(_with_min_sites(text, 4))
    with pytest.raises(ConfigError) as info:
        check_schedule(conf, "fraud", 0, ScheduleConfig(cron="0 3 * * 1", training="quorum4"))
    msg = str(info.value)
    assert "key 'datasets.fraud.schedules[0].training'" in msg and "does not load with dataset 'fraud'" in msg
    assert "federation.min_sites" in msg, msg


def test_validate_reports_a_cron_prefect_refuses(conf: Path) -> None:
    with pytest.raises(ConfigError) as info:
        check_schedule(conf, "fraud", 0, ScheduleConfig(cron="61 * * * *", training="fraud"))
    msg = str(info.value)
    assert "key 'datasets.fraud.schedules[0].cron': Prefect refuses it" in msg and "61 * * * *" in msg, msg


def test_insitu_validate_fails_on_a_bad_schedule(conf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _with_schedules(conf, [WEEKLY, {**WEEKLY, "training": "nope"}])
    with pytest.raises(typer.Exit) as info:
        validate(conf)
    assert info.value.exit_code == 1
    out = capsys.readouterr().out
    assert "schedule fraud[1]" in out and "1 problem(s)" in out, out


# --------------------------------------------------------------------------- insitu deploy
def test_each_entry_becomes_one_prefect_schedule_with_its_own_parameters(conf_dir: Path) -> None:
    fraud = _dataset(conf_dir)
    datasets = DatasetsConfig.model_validate({"datasets": {
        "fraud": {**fraud, "schedules": [WEEKLY, {"cron": "0 * * * *", "training": "fraud_single",
                                                  "active": False}]},
        "chargebacks": {**fraud, "schedules": [{"cron": "15 2 1 * *", "training": "fraud",
                                                "timezone": "America/New_York"}]},
        "quiet": fraud,
    }})
    got = [(s.cron, s.timezone, s.active, s.parameters) for s in retrain_schedules(datasets)]
    assert got == [
        ("0 3 * * 1", "Europe/Berlin", True, {"params": {"dataset": "fraud", "training": "fraud"}}),
        ("0 * * * *", "UTC", False, {"params": {"dataset": "fraud", "training": "fraud_single"}}),
        ("15 2 1 * *", "America/New_York", True, {"params": {"dataset": "chargebacks", "training": "fraud"}}),
    ]
    assert all(s.slug is None and s.interval is None and s.rrule is None for s in retrain_schedules(datasets))


def test_no_schedules_declared_means_none_deployed(conf_dir: Path) -> None:
    assert retrain_schedules(DatasetsConfig.model_validate({"datasets": {"fraud": _dataset(conf_dir)}})) == []


def test_prefect_refuses_what_five_fields_cannot_tell() -> None:
    with pytest.raises(ValueError, match="Invalid cron string"):
        retrain_schedule("fraud", ScheduleConfig(cron="0 3 * * 8", training="fraud"))
