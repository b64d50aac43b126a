"""Tests for ``insitu.config``: the real ``conf/`` loads, and bad configs fail with file, key and fix."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from insitu.config import ConfigError, load_conf, load_training

REPO = Path(__file__).resolve().parents[2]

CONF = REPO / "conf"
SITES = "sites.yaml"
DATASETS = "datasets.yaml"
TRAINING = "training/fraud.yaml"

Mutation = Callable[[Path], None]


# --------------------------------------------------------------------------- helpers
@pytest.fixture
def conf_copy(tmp_path: Path) -> Path:
    """A private copy of the repository's ``conf/`` that a test may break."""
    d = tmp_path / "conf"
    shutil.copytree(CONF, d)
    return d


def _edit(file: str, change: Callable[[dict[str, Any]], None]) -> Mutation:
    """A mutation that loads ``file`` from the conf copy, applies ``change`` to it and writes it back."""

    def mutate(conf: Path) -> None:
        path = conf / file
        data = yaml.safe_load(path.read_text())
        change(data)
        path.write_text(yaml.safe_dump(data, sort_keys=False))

    return mutate


def _set(file: str, keys: tuple[str | int, ...], value: Any) -> Mutation:
    """Set ``data[k0][k1]...[kn] = value`` in ``file``."""

    def change(data: dict[str, Any]) -> None:
        node: Any = data
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value

    return _edit(file, change)


def _delete(file: str, keys: tuple[str | int, ...]) -> Mutation:
    """Delete ``data[k0][k1]...[kn]`` from ``file``."""

    def change(data: dict[str, Any]) -> None:
        node: Any = data
        for k in keys[:-1]:
            node = node[k]
        del node[keys[-1]]

    return _edit(file, change)


def _write(file: str, text: str) -> Mutation:
    def mutate(conf: Path) -> None:
        (conf / file).write_text(text)

    return mutate


def _remove(file: str) -> Mutation:
    def mutate(conf: Path) -> None:
        (conf / file).unlink()

    return mutate


def _load_error(conf: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_conf("fraud", directory=conf)
    return str(info.value)


SHARDS = ("datasets", "fraud", "shards")
COLUMNS = ("datasets", "fraud", "schema", "columns")


# --------------------------------------------------------------------------- the real conf/
def test_real_conf_loads() -> None:
    conf = load_conf("fraud", directory=CONF)

    assert conf.sites.names == ["eu", "us", "apac"]
    assert conf.sites.exchange.storage == "s3://insitu-exchange/"
    assert conf.sites.site("eu").storage == "s3://insitu-eu/"
    assert conf.dataset_name == "fraud"
    assert conf.dataset.schema_.id == "transaction_id"
    assert conf.dataset.schema_.label == "is_fraud"
    assert "is_fraud" not in conf.dataset.schema_.feature_columns
    assert conf.training.optimizer.lr == pytest.approx(0.003)
    assert conf.training.seed == 7
    assert conf.training.federation.min_sites == 2
    assert conf.paths == {
        "sites": str(CONF / SITES),
        "datasets": str(CONF / DATASETS),
        "training": str(CONF / TRAINING),
    }


def test_real_conf_pins_every_shard_to_one_known_site() -> None:
    conf = load_conf("fraud", directory=CONF)
    shards = conf.dataset.shards

    ids = [s.id for s in shards]
    assert len(ids) == len(set(ids))
    assert {s.site for s in shards} == set(conf.sites.names)
    assert [s.id for s in conf.dataset.shards_of("eu")] == ["eu-000", "eu-001"]
    assert [s.id for s in conf.dataset.shards_of("us")] == ["us-000", "us-001"]
    assert [s.id for s in conf.dataset.shards_of("apac")] == ["apac-000", "apac-001", "apac-002"]
    assert conf.dataset.shard("apac-002").path == "raw/fraud/part-002.parquet"
    for s in shards:
        assert s.id.startswith(f"{s.site}-")
        assert not s.path.startswith("/") and "://" not in s.path


def test_unknown_site_lookup_is_a_config_error() -> None:
    conf = load_conf("fraud", directory=CONF)
    with pytest.raises(ConfigError, match="unknown site 'mars'"):
        conf.sites.site("mars")


def test_config_hash_is_stable_and_tracks_training_values(conf_copy: Path) -> None:
    base = load_conf("fraud", directory=CONF).config_hash()

    assert len(base) == 16 and int(base, 16) >= 0
    assert load_conf("fraud", directory=CONF).config_hash() == base
    # The hash is about content, not where conf/ lives.
    assert load_conf("fraud", directory=conf_copy).config_hash() == base
    # Overriding with the value already in the file, or with None (ignored), changes nothing.
    assert load_conf("fraud", directory=CONF, overrides={"rounds": 5}).config_hash() == base
    assert load_conf("fraud", directory=CONF, overrides={"rounds": None}).config_hash() == base

    changed = load_conf("fraud", directory=CONF, overrides={"rounds": 6})
    assert changed.training.rounds == 6
    assert changed.config_hash() != base
    assert load_conf("fraud", directory=CONF, overrides={"rounds": 6}).config_hash() == changed.config_hash()
    assert load_conf("fraud", directory=CONF, overrides={"seed": 8}).config_hash() not in (
        base,
        changed.config_hash(),
    )


def test_config_hash_tracks_edits_to_other_files(conf_copy: Path) -> None:
    base = load_conf("fraud", directory=conf_copy).config_hash()
    _set(SITES, ("sites", 0, "dask", "local_workers"), 4)(conf_copy)
    assert load_conf("fraud", directory=conf_copy).config_hash() != base


def test_bad_override_names_the_overrides_and_key() -> None:
    with pytest.raises(ConfigError) as info:
        load_conf("fraud", directory=CONF, overrides={"rounds": 0})
    msg = str(info.value)
    assert str(CONF / TRAINING) in msg
    assert "with overrides {'rounds': 0}" in msg
    assert "key 'rounds'" in msg
    assert "greater than or equal to 1" in msg


def test_unknown_dataset_is_reported() -> None:
    with pytest.raises(ConfigError) as info:
        load_conf("fraud", dataset="payments", directory=CONF)
    msg = str(info.value)
    assert str(CONF / DATASETS) in msg
    assert "key 'datasets.payments'" in msg
    assert "defined: ['fraud']" in msg


# --------------------------------------------------------------------------- bad configs
# Each case breaks one file of a copy of conf/. ``key`` is the dotted key the message must name
# (matched as a prefix, so a later, more precise key still passes); None for file-level errors.
BAD_CONFIGS = [
    pytest.param(
        TRAINING,
        _set(TRAINING, ("optimizer", "lrr"), 0.01),
        "optimizer.lrr",
        "check its spelling",
        id="unknown-key-typo",
    ),
    pytest.param(
        TRAINING,
        _set(TRAINING, ("rounds_",), 3),
        "rounds_",
        "unknown key",
        id="unknown-top-level-key",
    ),
    pytest.param(
        TRAINING,
        _set(TRAINING, ("optimizer", "lr"), -1),
        "optimizer.lr",
        "greater than 0 (got -1)",
        id="negative-lr",
    ),
    pytest.param(
        TRAINING,
        _set(TRAINING, ("aggregator",), "fedprox"),
        "aggregator",
        "known: ['fedavg']",
        id="unknown-aggregator",
    ),
    pytest.param(
        TRAINING,
        _set(TRAINING, ("model", "name"), "resnet50"),
        "model.name",
        "known: ['fraud_mlp']",
        id="unknown-model",
    ),
    pytest.param(
        TRAINING,
        _set(TRAINING, ("split", "train"), 0.8),
        "split",
        "must equal 1.0 (got 1.1)",
        id="split-not-summing-to-1",
    ),
    pytest.param(
        TRAINING,
        _set(TRAINING, ("federation", "min_sites"), 4),
        "federation.min_sites",
        "lower it to at most 3",
        id="min-sites-above-sites-with-data",
    ),
    pytest.param(
        DATASETS,
        _set(DATASETS, (*SHARDS, 6, "site"), "mars"),
        "datasets.fraud.shards[6].site",
        "sites.yaml defines ['eu', 'us', 'apac']",
        id="shard-pinned-to-unknown-site",
    ),
    pytest.param(
        DATASETS,
        _set(DATASETS, (*SHARDS, 1, "id"), "eu-000"),
        "datasets.fraud",
        "shard ids must be unique; rename the repeated ones: ['eu-000']",
        id="duplicate-shard-id",
    ),
    pytest.param(
        DATASETS,
        _set(DATASETS, ("datasets", "fraud", "schema", "label"), "fraud_flag"),
        "datasets.fraud.schema",
        "label column 'fraud_flag' is not among the columns",
        id="label-not-a-column",
    ),
    pytest.param(
        DATASETS,
        _delete(DATASETS, (*COLUMNS, "device", "values")),
        "datasets.fraud.schema.columns.device",
        "needs a non-empty 'values' list",
        id="category-without-values",
    ),
    pytest.param(
        DATASETS,
        _set(DATASETS, (*SHARDS, 0, "path"), "/data/part-000.parquet"),
        "datasets.fraud.shards[0].path",
        "relative to the site's storage URL",
        id="shard-path-absolute",
    ),
    pytest.param(
        DATASETS,
        _set(DATASETS, (*SHARDS, 2, "path"), "../insitu-eu/raw/fraud/part-000.parquet"),
        "datasets.fraud.shards[2].path",
        "no ..",
        id="shard-path-dotdot",
    ),
    pytest.param(
        SITES,
        _set(SITES, ("sites", 1, "storage"), "insitu-us/"),
        "sites[1].storage",
        "must be an fsspec URL such as s3://bucket/",
        id="storage-without-scheme",
    ),
    pytest.param(
        SITES,
        _set(SITES, ("sites", 2, "dask", "scheduler_env"), "apac-scheduler"),
        "sites[2].dask.scheduler_env",
        "should match pattern",
        id="env-var-name-malformed",
    ),
    pytest.param(
        TRAINING,
        _write(TRAINING, "model:\n  hidden: [64, 32\nrounds: 5\n"),
        None,
        "not valid YAML",
        id="yaml-syntax-error",
    ),
    pytest.param(
        DATASETS,
        _remove(DATASETS),
        None,
        "file not found",
        id="missing-file",
    ),
    pytest.param(
        SITES,
        _write(SITES, "- eu\n- us\n- apac\n"),
        None,
        "expected a mapping at the top level, got list",
        id="top-level-not-a-mapping",
    ),
]


@pytest.mark.parametrize(("file", "mutate", "key", "hint"), BAD_CONFIGS)
def test_bad_config_names_file_key_and_fix(
    conf_copy: Path, file: str, mutate: Mutation, key: str | None, hint: str
) -> None:
    mutate(conf_copy)
    msg = _load_error(conf_copy)

    assert str(conf_copy / file) in msg
    if key is not None:
        assert f"key '{key}" in msg
    assert hint in msg


# Cases caught by a model-level validator whose error pydantic reports at the model's own location.
# For the top-level models (SitesConfig, TrainingConfig) that is the root, so today the message says
# "key '<top level>'" instead of the offending key. ``key`` below is the key the message should name.
TOP_LEVEL_CHECKS = [
    pytest.param(
        SITES,
        _set(SITES, ("sites", 1, "name"), "eu"),
        "sites",
        "two sites share name 'eu'",
        id="duplicate-site-name",
    ),
    pytest.param(
        SITES,
        _set(SITES, ("sites", 1, "work_pool"), "insitu-eu"),
        "sites",
        "two sites share work_pool 'insitu-eu'",
        id="duplicate-site-work-pool",
    ),
    pytest.param(
        SITES,
        _set(SITES, ("exchange", "storage"), "s3://insitu-us"),
        "sites",
        "the exchange needs a store of its own",
        id="exchange-shares-site-store",
    ),
    pytest.param(
        TRAINING,
        _edit(TRAINING, lambda d: d.update(strategy="single", ranks_per_site=2)),
        "ranks_per_site",
        "set ranks_per_site: 1",
        id="single-strategy-with-two-ranks",
    ),
]


@pytest.mark.parametrize(("file", "mutate", "key", "hint"), TOP_LEVEL_CHECKS)
def test_cross_field_error_names_file_and_fix(
    conf_copy: Path, file: str, mutate: Mutation, key: str, hint: str
) -> None:
    mutate(conf_copy)
    msg = _load_error(conf_copy)

    assert str(conf_copy / file) in msg
    assert hint in msg


@pytest.mark.parametrize(("file", "mutate", "key", "hint"), TOP_LEVEL_CHECKS)
def test_cross_field_error_names_key(
    conf_copy: Path, file: str, mutate: Mutation, key: str, hint: str
) -> None:
    mutate(conf_copy)
    assert f"key '{key}" in _load_error(conf_copy)


def test_exchange_inside_a_site_store_is_rejected(conf_copy: Path) -> None:
    _set(SITES, ("exchange", "storage"), "s3://insitu-eu/exchange/")(conf_copy)
    assert "exchange" in _load_error(conf_copy)


def test_a_run_may_name_only_configs_of_its_own_conf_training(tmp_path: Path) -> None:
    from insitu.config import trusted_training

    conf = Path(__file__).resolve().parents[2] / "conf"
    assert trusted_training("fraud", conf) == str((conf / "training" / "fraud.yaml").resolve())
    assert trusted_training(str(conf / "training" / "fraud_single.yaml"), conf).endswith("fraud_single.yaml")
    secret = tmp_path / "identity.json"
    secret.write_text('{"audit_key": "00ff"}')
    for bad in (str(secret), str(conf / "training" / ".." / "sites.yaml"), "../sites", "/etc/passwd"):
        with pytest.raises(ConfigError, match="only configs in"):
            trusted_training(bad, conf)


def test_an_unknown_keys_value_is_not_echoed(tmp_path: Path) -> None:
    p = tmp_path / "t.yaml"
    p.write_text("audit_key: 00ff-secret\n")
    with pytest.raises(ConfigError) as e:
        load_training(p)
    assert "audit_key" in str(e.value) and "00ff-secret" not in str(e.value)
