"""Tests for ``insitu.conf`` on the fixture ``conf/`` (tests/fixtures/conf): it loads, and bad configs fail with
file, key and fix. That the shipped ``conf/`` loads is test_shipped_conf.py's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from insitu.conf import (
    JOB_ID_PATTERN,
    ConfigError,
    ConfLoader,
    check_job_id,
    load_conf,
    load_datasets,
    load_training,
    trusted_training,
)
from insitu.job import load_job

SITES = "sites.yaml"
DATASETS = "datasets.yaml"
TRAINING = "training/fraud.yaml"
EU_WORKERS = "      local_workers: 4"  # as in the fixture's sites.yaml

Mutation = Callable[[Path], None]


# --------------------------------------------------------------------------- helpers
# conf_dir (the fixture conf/, read only) and conf_copy (a private copy a test may break): tests/unit/conftest.py
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
        load_job("fraud", directory=conf)  # the configuration and every component it names
    return str(info.value)


SHARDS = ("datasets", "fraud", "shards")
COLUMNS = ("datasets", "fraud", "schema", "columns")


# --------------------------------------------------------------------------- a conf/ that loads
def test_a_conf_loads(conf_dir: Path) -> None:
    conf = load_conf("fraud", directory=conf_dir)

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
        "sites": str(conf_dir / SITES),
        "datasets": str(conf_dir / DATASETS),
        "training": str(conf_dir / TRAINING),
    }


def test_every_shard_is_pinned_to_one_known_site(conf_dir: Path) -> None:
    conf = load_conf("fraud", directory=conf_dir)
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


def test_unknown_site_lookup_is_a_config_error(conf_dir: Path) -> None:
    conf = load_conf("fraud", directory=conf_dir)
    with pytest.raises(ConfigError, match="unknown site 'mars'"):
        conf.sites.site("mars")


def test_config_hash_is_stable_and_tracks_training_values(conf_dir: Path, conf_copy: Path) -> None:
    base = load_conf("fraud", directory=conf_dir).config_hash()

    assert len(base) == 16 and int(base, 16) >= 0
    assert load_conf("fraud", directory=conf_dir).config_hash() == base
    # The hash is about content, not where conf/ lives.
    assert load_conf("fraud", directory=conf_copy).config_hash() == base
    # Overriding with the value already in the file, or with None (ignored), changes nothing.
    assert load_conf("fraud", directory=conf_dir, overrides={"rounds": 5}).config_hash() == base
    assert load_conf("fraud", directory=conf_dir, overrides={"rounds": None}).config_hash() == base

    changed = load_conf("fraud", directory=conf_dir, overrides={"rounds": 6})
    assert changed.training.rounds == 6
    assert changed.config_hash() != base
    assert load_conf("fraud", directory=conf_dir, overrides={"rounds": 6}).config_hash() == changed.config_hash()
    assert load_conf("fraud", directory=conf_dir, overrides={"seed": 8}).config_hash() not in (
        base,
        changed.config_hash(),
    )


def test_config_hash_tracks_edits_to_other_files(conf_copy: Path) -> None:
    base = load_conf("fraud", directory=conf_copy).config_hash()
    _set(SITES, ("sites", 0, "dask", "local_workers"), 6)(conf_copy)
    assert load_conf("fraud", directory=conf_copy).config_hash() != base


def test_bad_override_names_the_overrides_and_key(conf_dir: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_conf("fraud", directory=conf_dir, overrides={"rounds": 0})
    msg = str(info.value)
    assert str(conf_dir / TRAINING) in msg
    assert "with overrides {'rounds': 0}" in msg
    assert "key 'rounds'" in msg
    assert "greater than or equal to 1" in msg


def test_unknown_dataset_is_reported(conf_dir: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_conf("fraud", dataset="payments", directory=conf_dir)
    msg = str(info.value)
    assert str(conf_dir / DATASETS) in msg
    assert "key 'datasets.payments'" in msg
    assert "defined: ['card_sequences', 'digits', 'fraud']" in msg


# --------------------------------------------------------------------------- bad configs
# Each case breaks one file of a copy of the fixture conf/. ``key`` is the dotted key the message must name
# (matched as a prefix, so a later, more precise key still passes); None for file-level errors.
BAD_CONFIGS = [
    pytest.param(
        TRAINING,
        _set(TRAINING, ("optimizer", "lrr"), 0.01),
        "optimizer.lrr",
        "remove it or check the spelling (did you mean 'lr'?); known keys: name, lr, weight_decay, momentum",
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
        _set(TRAINING, ("aggregator",), "fedsgd"),
        "aggregator",
        "unknown aggregator 'fedsgd' (did you mean 'fedavg'?); known: ['fedadagrad', 'fedadam', 'fedavg'",
        id="unknown-aggregator",
    ),
    pytest.param(
        TRAINING,
        _set(TRAINING, ("federation", "compression"), {"encoding": "int4"}),
        "federation.compression.encoding",
        "unknown encoding 'int4' (did you mean 'int8'?); known: none, bf16, fp16, int8, topk",
        id="unknown-update-encoding",
    ),
    pytest.param(
        TRAINING,
        _set(TRAINING, ("federation", "compression"), {"encoding": "topk", "options": {"fraction": 2}}),
        "federation.compression.options",
        "less than or equal to 0.5",
        id="topk-fraction-over-half",
    ),
    pytest.param(
        TRAINING,
        _set(TRAINING, ("federation", "compression"), {"encoding": "topk", "delta": False}),
        "federation.compression.delta",
        "topk only encodes an update's difference from the global model; set delta: true",
        id="topk-without-delta",
    ),
    pytest.param(
        TRAINING,
        _set(TRAINING, ("model", "name"), "resnet50"),
        "model.name",
        "built in: ['fraud_mlp', 'sequence_transformer', 'tabular_mlp'], or your own factory as "
        "'package.module:function'",
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
        "datasets.fraud.shards[1].id",
        "shard ids must be unique, ignoring case: 'eu-000' repeats shards[0].id 'eu-000'; rename one of them",
        id="duplicate-shard-id",
    ),
    pytest.param(
        DATASETS,
        _set(DATASETS, (*SHARDS, 3, "id"), "EU-001"),
        "datasets.fraud.shards[3].id",
        "'EU-001' repeats shards[1].id 'eu-001'",
        id="duplicate-shard-id-ignoring-case",
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
        _set(DATASETS, ("datasets", "fraud", "schema", "label"), "is_frad"),
        "datasets.fraud.schema",
        "label column 'is_frad' is not among the columns (did you mean 'is_fraud'?)",
        id="label-typo-gets-a-suggestion",
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


# Cases caught by a validator that compares several keys (pydantic reports them at the model's own
# location); the message still names the offending key itself. ``key`` is that key.
TOP_LEVEL_CHECKS = [
    pytest.param(
        SITES,
        _set(SITES, ("sites", 1, "name"), "eu"),
        "sites[1].name'",
        "two sites share name 'eu'",
        id="duplicate-site-name",
    ),
    pytest.param(
        SITES,
        _set(SITES, ("sites", 1, "work_pool"), "insitu-eu"),
        "sites[1].work_pool'",
        "two sites share work_pool 'insitu-eu'",
        id="duplicate-site-work-pool",
    ),
    pytest.param(
        SITES,
        _set(SITES, ("exchange", "storage"), "s3://insitu-us"),
        "sites[1].storage'",
        "the exchange needs a store of its own",
        id="exchange-shares-site-store",
    ),
    pytest.param(
        TRAINING,
        _edit(TRAINING, lambda d: d.update(strategy="single", ranks_per_site=2)),
        "ranks_per_site'",
        "set ranks_per_site: 1",
        id="single-strategy-with-two-ranks",
    ),
    pytest.param(
        TRAINING,
        _edit(TRAINING, lambda d: d.update(federation={"mode": "async"}, validation={"select": "last"},
                                           aggregator="fedadam")),
        "aggregator'",
        "is a synchronous round's",
        id="async-with-a-round-aggregator",
    ),
    pytest.param(
        TRAINING,
        _edit(TRAINING, lambda d: d.update(federation={"mode": "async"})),
        "validation'",
        "set validation.select: last",
        id="async-selects-the-last-version",
    ),
    pytest.param(
        TRAINING,
        _edit(TRAINING, lambda d: d.update(federation={"mode": "async", "asynchronous": {"alpha": 2.0}},
                                           validation={"select": "last"})),
        "federation.asynchronous'",
        "alpha must be at most 1",
        id="fedasync-alpha-above-one",
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


def test_a_run_may_name_only_configs_of_its_own_conf_training(conf_dir: Path, tmp_path: Path) -> None:
    conf = conf_dir
    assert trusted_training("fraud", conf) == str((conf / "training" / "fraud.yaml").resolve())
    assert trusted_training("fraud_single", conf).endswith("fraud_single.yaml")
    secret = tmp_path / "identity.json"
    secret.write_text('{"audit_key": "00ff"}')
    bad = (
        str(secret),
        str(conf / "training" / ".." / "sites.yaml"),
        str(conf / "training" / "fraud.yaml"),  # a path, even one inside conf/training: names only
        "../sites",
        "training/fraud",
        "fraud.yaml",
        "/etc/passwd",
        "",
        ".hidden",
        "fraud\n",
        "a" * 65,
    )
    for b in bad:
        with pytest.raises(ConfigError, match="only configs in .* may be run, named without path or suffix"):
            trusted_training(b, conf)


def test_an_unknown_keys_value_is_not_echoed(tmp_path: Path) -> None:
    p = tmp_path / "t.yaml"
    p.write_text("audit_key: 00ff-secret\n")
    with pytest.raises(ConfigError) as e:
        load_training(p)
    assert "audit_key" in str(e.value) and "00ff-secret" not in str(e.value)


# --------------------------------------------------------------------------- configuration hardening
def test_site_stores_are_read_normalised(conf_copy: Path) -> None:
    _set(SITES, ("sites", 0, "storage"), "S3://Insitu-EU//raw/./x/../")(conf_copy)
    _set(SITES, ("exchange", "storage"), "s3://insitu-exchange")(conf_copy)
    conf = load_conf("fraud", directory=conf_copy)

    assert conf.sites.site("eu").storage == "s3://insitu-eu/raw/"
    assert conf.sites.exchange.storage == "s3://insitu-exchange/"


def test_sibling_prefixes_of_one_bucket_do_not_overlap(conf_copy: Path) -> None:
    _set(SITES, ("sites", 0, "storage"), "s3://insitu-shared/eu/")(conf_copy)
    _set(SITES, ("sites", 1, "storage"), "s3://insitu-shared/eu2/")(conf_copy)
    conf = load_conf("fraud", directory=conf_copy)

    assert [s.storage for s in conf.sites.sites][:2] == ["s3://insitu-shared/eu/", "s3://insitu-shared/eu2/"]


# Each case gives two owners (sites, or a site and the exchange) something that must be each one's own.
SITES_CONFLICTS = [
    pytest.param(("sites", 1, "storage"), "s3://insitu-eu/", "sites[1].storage",
                 "overlaps sites[0].storage s3://insitu-eu/", id="same-store"),
    pytest.param(("sites", 1, "storage"), "S3://Insitu-EU/x/../", "sites[1].storage",
                 "overlaps sites[0].storage s3://insitu-eu/", id="same-store-spelt-otherwise"),
    pytest.param(("sites", 1, "storage"), "s3://insitu-eu//us/", "sites[1].storage",
                 "store s3://insitu-eu/us/ overlaps sites[0].storage s3://insitu-eu/", id="store-inside-another"),
    pytest.param(("sites", 0, "storage"), "s3://insitu-us/eu/", "sites[1].storage",
                 "store s3://insitu-us/ overlaps sites[0].storage s3://insitu-us/eu/", id="store-around-another"),
    pytest.param(("exchange", "storage"), "s3://insitu-eu/exchange/", "sites[0].storage",
                 "overlaps exchange.storage s3://insitu-eu/exchange/; the exchange needs a store of its own",
                 id="exchange-inside-a-site-store"),
    pytest.param(("sites", 2, "storage"), "s3://insitu-exchange/apac", "sites[2].storage",
                 "overlaps exchange.storage s3://insitu-exchange/; the exchange needs a store of its own",
                 id="site-store-inside-the-exchange"),
    pytest.param(("sites", 1, "key_env"), "INSITU_EU_AWS_ACCESS_KEY_ID", "sites[1].key_env",
                 "variable INSITU_EU_AWS_ACCESS_KEY_ID is also named by sites[0].key_env", id="shared-key-env"),
    pytest.param(("sites", 2, "secret_env"), "INSITU_US_AWS_SECRET_ACCESS_KEY", "sites[2].secret_env",
                 "also named by sites[1].secret_env", id="shared-secret-env"),
    pytest.param(("sites", 1, "endpoint_env"), "INSITU_EU_S3_ENDPOINT", "sites[1].endpoint_env",
                 "also named by sites[0].endpoint_env", id="shared-endpoint-env"),
    pytest.param(("sites", 2, "dask", "scheduler_env"), "INSITU_EU_DASK_SCHEDULER", "sites[2].dask.scheduler_env",
                 "also named by sites[0].dask.scheduler_env", id="shared-scheduler-env"),
    pytest.param(("sites", 0, "secret_env"), "INSITU_EXCHANGE_AWS_SECRET_ACCESS_KEY", "sites[0].secret_env",
                 "also named by exchange.secret_env", id="site-names-an-exchange-variable"),
    pytest.param(("sites", 1, "key_env"), "INSITU_EU_AWS_SECRET_ACCESS_KEY", "sites[1].key_env",
                 "also named by sites[0].secret_env", id="another-sites-variable-in-another-role"),
]


@pytest.mark.parametrize(("keys", "value", "key", "hint"), SITES_CONFLICTS)
def test_what_a_site_owns_is_its_own(
    conf_copy: Path, keys: tuple[str | int, ...], value: str, key: str, hint: str
) -> None:
    _set(SITES, keys, value)(conf_copy)
    msg = _load_error(conf_copy)

    assert msg.startswith(f"{conf_copy / SITES}: key '{key}': ")
    assert hint in msg
    assert ("store of its own" in msg) or ("variables of their own" in msg and "rename one of them" in msg)


BAD_STORE_URLS = [
    pytest.param("s3://insitu-eu/../insitu-us/", "climbs above the bucket", id="dotdot-escapes-the-bucket"),
    pytest.param("s3://insitu-eu/a/../../b/", "climbs above the bucket", id="dotdot-escapes-after-a-segment"),
    pytest.param("s3://", "names no bucket", id="no-bucket"),
    pytest.param("s3:///insitu-eu/", "names no bucket", id="empty-bucket"),
    pytest.param("s3://insitu-eu/?versionId=1", "query string", id="query-string"),
    pytest.param("s3://insitu-eu/raw#x", "fragment", id="fragment"),
    pytest.param("s3://insitu-eu/%2e%2e/", "%-escape", id="percent-escape"),
    pytest.param("http://insitu-eu/", "must be an fsspec URL", id="unknown-scheme"),
    pytest.param("file://data/x", "absolute path", id="relative-file-url"),
]


@pytest.mark.parametrize(("url", "hint"), BAD_STORE_URLS)
def test_a_bad_store_url_is_refused(conf_copy: Path, url: str, hint: str) -> None:
    _set(SITES, ("sites", 1, "storage"), url)(conf_copy)
    msg = _load_error(conf_copy)

    assert msg.startswith(f"{conf_copy / SITES}: key 'sites[1].storage': ")
    assert hint in msg


def test_credentials_pasted_into_a_store_url_are_not_echoed(conf_copy: Path) -> None:
    _set(SITES, ("sites", 1, "storage"), "s3://AKIAEXAMPLE:wJalrSECRET@insitu-us/")(conf_copy)
    msg = _load_error(conf_copy)

    assert "key 'sites[1].storage'" in msg and "credentials never go in the URL" in msg
    assert "AKIAEXAMPLE" not in msg and "wJalrSECRET" not in msg


# Duplicate keys, at every depth and in every file; ``line`` is the line of the second one.
DUPLICATE_KEYS = [
    pytest.param(TRAINING, "rounds: 5\n", "rounds: 5\nrounds: 50\n", "rounds", id="top-level"),
    pytest.param(TRAINING, "  lr: 0.003\n", "  lr: 0.003\n  lr: 0.3\n", "optimizer.lr", id="nested"),
    pytest.param(SITES, "    work_pool: insitu-us\n", "    work_pool: insitu-us\n    work_pool: insitu-eu\n",
                 "sites[1].work_pool", id="in-a-list-item"),
    pytest.param(SITES, f"{EU_WORKERS}\n    devices: cpu\n  - name: us\n",
                 f"{EU_WORKERS}\n      local_workers: 8\n    devices: cpu\n  - name: us\n",
                 "sites[0].dask.local_workers", id="deep-in-a-list-item"),
    pytest.param(DATASETS, "        hour: {type: int, min: 0, max: 23}\n",
                 "        hour: {type: int, min: 0, max: 23}\n        hour: {type: float}\n",
                 "datasets.fraud.schema.columns.hour", id="in-datasets"),
    pytest.param(DATASETS, "{id: eu-000, site: eu, path:", "{id: eu-000, site: eu, site: us, path:",
                 "datasets.fraud.shards[0].site", id="in-a-flow-mapping"),
]


@pytest.mark.parametrize(("file", "old", "new", "key"), DUPLICATE_KEYS)
def test_a_duplicate_yaml_key_is_refused(conf_copy: Path, file: str, old: str, new: str, key: str) -> None:
    path = conf_copy / file
    before = path.read_text()
    assert old in before
    path.write_text(before.replace(old, new, 1))
    # the second key is on the first line that the edit changed
    pairs = zip(before.splitlines(), path.read_text().splitlines(), strict=False)
    line = next(i for i, (a, b) in enumerate(pairs, 1) if a != b)
    msg = _load_error(conf_copy)

    assert msg.startswith(f"{path}: line {line}: key '{key}': duplicate key (first at line ")
    assert "remove or rename one of them" in msg


def test_yaml_merge_keys_may_still_be_overridden() -> None:
    text = "base: &b {lr: 1, momentum: 0.5}\nopt:\n  <<: *b\n  lr: 2\n"
    merged = {"base": {"lr": 1, "momentum": 0.5}, "opt": {"lr": 2, "momentum": 0.5}}
    assert yaml.load(text, Loader=ConfLoader) == merged
    with pytest.raises(yaml.YAMLError, match="duplicate key 'opt.lr' at line 5"):
        yaml.load(text + "  lr: 3\n", Loader=ConfLoader)


# Values that must never reach a message: under an unknown key, under a *_env key, on a line YAML can't parse.
SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
NOT_ECHOED = [
    pytest.param(SITES, _set(SITES, ("sites", 1, "aws_secret_access_key"), SECRET), "sites[1].aws_secret_access_key",
                 "unknown key; remove it or check the spelling; known keys: storage, endpoint_env, key_env, "
                 "secret_env, outage_s, name, work_pool, dask, devices", id="unknown-key-in-a-site"),
    pytest.param(DATASETS, _set(DATASETS, (*SHARDS, 2, "token"), SECRET), "datasets.fraud.shards[2].token",
                 "known keys: id, site, path", id="unknown-key-in-a-shard"),
    pytest.param(DATASETS, _set(DATASETS, ("datasets", "fraud", "password"), SECRET), "datasets.fraud.password",
                 "known keys: description, split_key, schema, shards", id="unknown-key-in-a-dataset"),
    pytest.param(TRAINING, _set(TRAINING, ("api_key",), {"value": SECRET}), "api_key",
                 "known keys: task, model, optimizer, rounds", id="unknown-top-level-mapping"),
    pytest.param(SITES, _set(SITES, ("exchange", "secret_env"), SECRET), "exchange.secret_env",
                 "should match pattern", id="secret-pasted-as-a-variable-name"),
    pytest.param(TRAINING, _write(TRAINING, f"optimizer:\n  lr: [{SECRET}\nrounds: 5\n"), None,
                 "not valid YAML at line", id="yaml-error-quotes-no-line"),
]


@pytest.mark.parametrize(("file", "mutate", "key", "hint"), NOT_ECHOED)
def test_a_value_that_may_be_a_secret_is_not_echoed(
    conf_copy: Path, file: str, mutate: Mutation, key: str | None, hint: str
) -> None:
    mutate(conf_copy)
    msg = _load_error(conf_copy)

    assert str(conf_copy / file) in msg
    if key is not None:
        assert f"key '{key}'" in msg
    assert hint in msg
    assert SECRET[:12] not in msg


def test_a_training_config_may_not_be_a_link_out_of_conf_training(conf_copy: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text((conf_copy / TRAINING).read_text())
    (conf_copy / "training" / "linked.yaml").symlink_to(outside)
    (conf_copy / "training" / "alias.yaml").symlink_to(conf_copy / TRAINING)

    with pytest.raises(ConfigError, match="linked.yaml links out of it"):
        trusted_training("linked", conf_copy)
    with pytest.raises(ConfigError, match="links out of it"):
        load_conf("linked", directory=conf_copy)
    # a link that stays inside conf/training is just another name
    assert trusted_training("alias", conf_copy) == str((conf_copy / TRAINING).resolve())


def test_an_unknown_training_name_lists_the_known_ones(conf_copy: Path) -> None:
    known = r"\['card_sequences', 'digits', 'fraud', 'fraud_single'\]"
    with pytest.raises(ConfigError, match=rf"holds no nope\.yaml \(it holds {known}\)"):
        trusted_training("nope", conf_copy)


def test_load_conf_refuses_a_training_name_that_is_a_path(conf_copy: Path) -> None:
    # Before: '../sites' became conf/training/../sites.yaml and sites.yaml was read as a training config.
    for bad in ("../sites", "training/fraud", "fraud/../../sites"):
        with pytest.raises(ConfigError, match="only configs in") as info:
            load_conf(bad, directory=conf_copy)
        assert "sites.yaml" not in str(info.value)


def test_a_long_attacker_value_is_cut_short(conf_copy: Path) -> None:
    long = "/etc/" + "x" * 5000
    with pytest.raises(ConfigError) as info:
        trusted_training(long, conf_copy)
    assert "x" * 50 not in str(info.value) and len(str(info.value)) < 400
    with pytest.raises(ConfigError) as info:
        load_conf("fraud", dataset=long, directory=conf_copy)
    assert "x" * 50 not in str(info.value) and len(str(info.value)) < 400


@pytest.mark.parametrize("dataset", ["../fraud", "fraud/shards", "", "fraud\n", "-fraud"])
def test_a_dataset_is_named_by_a_plain_key_of_datasets_yaml(conf_dir: Path, dataset: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_conf("fraud", dataset=dataset, directory=conf_dir)
    msg = str(info.value)
    assert str(conf_dir / DATASETS) in msg and "a run names a dataset by its key in datasets.yaml" in msg
    assert "defined: ['card_sequences', 'digits', 'fraud']" in msg


def test_a_dataset_key_that_no_run_could_name_is_refused(conf_copy: Path) -> None:
    _edit(DATASETS, lambda d: d["datasets"].update({"fraud/eu": d["datasets"]["fraud"]}))(conf_copy)
    with pytest.raises(ConfigError) as info:  # the whole file, as `insitu validate` reads it
        load_datasets(conf_copy / DATASETS)
    msg = str(info.value)
    assert f"{conf_copy / DATASETS}: key 'datasets': dataset 'fraud/eu' is not a plain name" in msg
    assert "rename it" in msg
    assert load_conf("fraud", "fraud", directory=conf_copy)  # a job on another dataset is not blocked


def test_check_job_id() -> None:
    for ok in ("20240101-120000-abc123", "e2e-kill-1a2b3c", "a", "A.b_c-d", "x" * 100):
        assert check_job_id(ok) == ok
    for bad in ("", "-x", ".x", "a/b", "../x", "a b", "a\n", "x" * 101, "job;rm"):
        with pytest.raises(ValueError, match="is not a job id") as info:
            check_job_id(bad)
        assert JOB_ID_PATTERN in str(info.value)
    with pytest.raises(ValueError) as info:
        check_job_id("y" * 5000)
    assert "y" * 50 not in str(info.value)


def test_one_broken_dataset_does_not_block_a_job_on_another(conf_copy: Path) -> None:
    path = conf_copy / "datasets.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["datasets"]["claims"] = {"schema": {"id": "claim_id", "label": "fraud", "columns": {
        "claim_id": {"type": "string"}, "fraud": {"type": "bool"}, "cost": {"type": "money"}}},
        "shards": [{"id": "c-0", "site": "eu", "path": "raw/claims.parquet"}]}
    path.write_text(yaml.safe_dump(raw))
    assert load_conf("fraud", "fraud", directory=conf_copy).dataset_name == "fraud"
    with pytest.raises(ConfigError, match=r"key 'datasets.claims.schema.columns.cost.type'"):
        load_conf("fraud", "claims", directory=conf_copy)
    with pytest.raises(ConfigError, match=r"datasets.claims"):  # the whole file, as `insitu validate` checks it
        load_datasets(path)


def test_a_nullable_number_feature_is_refused_because_nothing_imputes_it() -> None:
    from pydantic import ValidationError

    from insitu.conf import SchemaConfig

    cols = {"id": {"type": "string"}, "y": {"type": "bool"}, "age": {"type": "float", "nullable": True}}
    with pytest.raises(ValidationError, match="feature 'age' of type float is nullable.*does not impute"):
        SchemaConfig.model_validate({"id": "id", "label": "y", "columns": cols})
    cols["age"] = {"type": "category", "values": ["young", "old"], "nullable": True}  # all-zero one-hot: fine
    SchemaConfig.model_validate({"id": "id", "label": "y", "columns": cols})


def test_async_mode_and_its_keys_load(conf_copy: Path) -> None:
    _edit(TRAINING, lambda d: d.update(
        federation={"mode": "async", "min_sites": 2,
                    "asynchronous": {"algorithm": "fedbuff", "buffer_size": 3, "alpha": 1.5, "max_staleness": 1,
                                     "staleness": {"function": "hinge", "a": 2, "b": 1}}},
        validation={"select": "last"}))(conf_copy)
    f = load_conf("fraud", directory=conf_copy).training.federation
    assert f.mode == "async"
    assert f.asynchronous.algorithm == "fedbuff" and f.asynchronous.buffer_size == 3
    assert f.asynchronous.staleness.function == "hinge" and f.asynchronous.max_staleness == 1


def test_the_default_mode_is_sync(conf_dir: Path) -> None:
    assert load_conf("fraud", directory=conf_dir).training.federation.mode == "sync"


def test_a_job_cannot_slow_a_site_down(conf_copy: Path) -> None:
    """The test knob that did (federation.simulated_delay_s) is gone from the user's schema: a site's own operator
    slows it (insitu/federated/publish_delay.py), never a job's configuration."""
    _edit(TRAINING, lambda d: d["federation"].update(simulated_delay_s={"us": 1.0}))(conf_copy)
    assert "key 'federation.simulated_delay_s': unknown key" in _load_error(conf_copy)
