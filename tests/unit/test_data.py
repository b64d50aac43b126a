"""Data path: synthetic generator, schema validation, features, splits, and prepare_shard on a file:// store."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from insitu.conf import Conf, SchemaConfig, SplitConfig, load_conf
from insitu.data.features import assign_split, feature_names, featurize
from insitu.data.loader import load_split
from insitu.data.prepare import SPLITS, prepare_shard, prepared_prefix, quarantine_prefix, summarize
from insitu.data.schema import REASON, SchemaError, validate
from insitu.data.synthetic import check_matches_schema, generate, inject_malformed
from insitu.storage import Store


@pytest.fixture(scope="module")
def conf(conf_dir: Path) -> Conf:
    return load_conf("fraud", directory=conf_dir)


@pytest.fixture(scope="module")
def schema(conf: Conf) -> SchemaConfig:
    return conf.dataset.schema_


@pytest.fixture(scope="module")
def split(conf: Conf) -> SplitConfig:
    return conf.training.split


# --------------------------------------------------------------------------- synthetic
def test_generate_is_deterministic_per_seed(schema: SchemaConfig) -> None:
    a = generate("eu", 300, seed=5, shard=1)
    pd.testing.assert_frame_equal(a, generate("eu", 300, seed=5, shard=1))
    assert not a["amount"].equals(generate("eu", 300, seed=6, shard=1)["amount"])
    assert not a["amount"].equals(generate("eu", 300, seed=5, shard=2)["amount"])
    assert a["transaction_id"].iloc[0] == "eu-001-00000000"
    assert a["transaction_id"].is_unique
    check_matches_schema(schema)  # the generator writes exactly the schema's columns


def test_sites_differ_in_fraud_rate_and_amount_scale() -> None:
    eu = generate("eu", 20_000, seed=1)
    us = generate("us", 20_000, seed=1)
    # profiles: eu 2.0 % fraud at amount scale 55, us 4.5 % at scale 95
    assert eu["is_fraud"].mean() == pytest.approx(0.020, abs=0.006)
    assert us["is_fraud"].mean() == pytest.approx(0.045, abs=0.008)
    assert eu["amount"].median() == pytest.approx(55.0, rel=0.1)
    assert us["amount"].median() == pytest.approx(95.0, rel=0.1)
    assert set(eu["country"]) <= {"DE", "FR", "ES", "IT", "NL", "OTHER"}
    assert set(us["country"]) <= {"US", "CA", "MX", "OTHER"}


def test_clean_rows_all_pass(schema: SchemaConfig) -> None:
    df = generate("apac", 500, seed=3)
    good, bad = validate(df, schema)
    assert len(bad) == 0 and len(good) == 500
    assert list(good["transaction_id"]) == list(df["transaction_id"])
    assert good["amount"].dtype == np.float64 and good["hour"].dtype == np.int64
    assert good["is_fraud"].dtype == bool and good["foreign"].dtype == bool


def test_malformed_rows_are_all_quarantined_with_their_column(schema: SchemaConfig) -> None:
    clean = generate("eu", 400, seed=2)
    dirty, n = inject_malformed(clean, 0.1, seed=9)
    assert n == 40
    good, bad = validate(dirty, schema)
    assert len(bad) == n and len(good) == len(clean) - n
    assert REASON in bad.columns and REASON not in good.columns
    assert set(good["transaction_id"]).isdisjoint(bad["transaction_id"])

    # for each quarantined row, find the column inject_malformed changed: the reason names it
    by_id = clean.set_index("transaction_id")
    dirty_by_id = dirty.set_index("transaction_id")
    seen_columns = set()
    for tid, reason in zip(bad["transaction_id"], bad[REASON], strict=True):
        before, after = by_id.loc[tid], dirty_by_id.loc[tid]
        changed = [c for c in clean.columns if c != "transaction_id" and not _same(before[c], after[c])]
        assert len(changed) == 1, (tid, changed)
        assert reason.startswith(f"{changed[0]}: "), (reason, changed)
        seen_columns.add(changed[0])
    assert seen_columns == {"amount", "merchant_category", "hour", "card_age_days"}
    reasons = set(bad[REASON])
    assert "card_age_days: missing value" in reasons
    assert "hour: above maximum 23" in reasons
    assert "amount: below minimum 0" in reasons
    assert "merchant_category: value not in the schema's list" in reasons


def _same(a: object, b: object) -> bool:
    if pd.isna(a) and pd.isna(b):
        return True
    return bool(a == b)


def test_other_faults(schema: SchemaConfig) -> None:
    df = generate("eu", 6, seed=0).astype({"hour": object, "foreign": object})
    df.loc[1, "hour"] = 3.5
    df.loc[2, "hour"] = "noon"
    df.loc[3, "foreign"] = "maybe"
    df.loc[5, "transaction_id"] = df.loc[4, "transaction_id"]
    good, bad = validate(df, schema)
    assert dict(zip(bad["transaction_id"], bad[REASON], strict=True)) == {
        "eu-000-00000001": "hour: not an integer",
        "eu-000-00000002": "hour: not a number",
        "eu-000-00000003": "foreign: not a boolean",
        "eu-000-00000004": "transaction_id: duplicate id in shard",
    }
    assert list(good["transaction_id"]) == ["eu-000-00000000", "eu-000-00000004"]


def test_missing_column_raises(schema: SchemaConfig) -> None:
    df = generate("eu", 10, seed=0).drop(columns=["device"])
    with pytest.raises(SchemaError, match=r"missing columns 'device'; the file has unexpected columns \[\]"):
        validate(df, schema)


def test_a_misspelt_column_gets_a_did_you_mean(schema: SchemaConfig) -> None:
    df = generate("eu", 10, seed=0).rename(columns={"amount": "amout"})
    with pytest.raises(SchemaError, match=r"missing columns 'amount' \(did you mean 'amout'\?\).*conf/datasets.yaml"):
        validate(df, schema)


def test_a_shard_whose_every_row_is_quarantined_fails_its_site_with_the_rules(
    tmp_path: Path, conf: Conf, schema: SchemaConfig
) -> None:
    from tasks.prepare import publishable

    _premake_dirs(tmp_path)
    shard = conf.dataset.shard("eu-000")
    (tmp_path / "raw/fraud").mkdir(parents=True)
    generate("eu", 50, seed=0).assign(amount="n/a").to_parquet(tmp_path / shard.path, index=False)
    rep = prepare_shard(Store("file://" + str(tmp_path) + "/", {}), shard, schema, conf.training.split, 7, DATASET,
                        JOB)
    assert rep.reasons == {"amount: not a number": 50} and rep.rows_prepared == 0
    with pytest.raises(ValueError, match=r"no row of its shards could be prepared.*eu-000: all rows quarantined: "
                                         r"50 × amount: not a number"):
        publishable([rep], 0, "eu")
    assert "reasons" not in summarize([rep])["shards"]["eu-000"]  # the rules stay on the site


# --------------------------------------------------------------------------- features and splits
def test_featurize_width_matches_feature_names(schema: SchemaConfig) -> None:
    good, _ = validate(generate("us", 200, seed=4), schema)
    x, y = featurize(good, schema)
    names = feature_names(schema)
    # amount, 8 categories, 13 countries, hour, 4 devices, card_age_days, txn_last_24h, foreign
    assert len(names) == 30
    assert x.shape == (200, len(names)) and x.dtype == np.float32
    assert y.shape == (200,) and y.dtype == np.float32
    assert np.array_equal(y, good["is_fraud"].to_numpy(dtype=np.float32))
    # the amount is log-scaled (min 0), one-hot groups sum to one, hour is raw
    assert np.allclose(x[:, names.index("amount")], np.log1p(good["amount"]), rtol=1e-6)
    cats = [i for i, n in enumerate(names) if n.startswith("merchant_category=")]
    assert np.array_equal(x[:, cats].sum(axis=1), np.ones(200, dtype=np.float32))
    grocery = names.index("merchant_category=grocery")
    assert np.array_equal(x[:, grocery] == 1, (good["merchant_category"] == "grocery").to_numpy())
    assert np.array_equal(x[:, names.index("hour")], good["hour"].to_numpy(dtype=np.float32))
    x0, y0 = featurize(good.iloc[0:0], schema)
    assert x0.shape == (0, 30) and y0.shape == (0,)


def test_assign_split_deterministic_and_fractions(split: SplitConfig) -> None:
    ids = pd.Series([f"eu-000-{i:08d}" for i in range(20_000)])
    a = assign_split(ids, split, seed=7)
    assert np.array_equal(a, assign_split(ids, split, seed=7))
    assert set(a) == set(SPLITS)
    frac = {s: float(np.mean(a == s)) for s in SPLITS}
    assert frac["train"] == pytest.approx(split.train, abs=0.02)
    assert frac["val"] == pytest.approx(split.val, abs=0.015)
    assert frac["test"] == pytest.approx(split.test, abs=0.015)
    # another seed gives another assignment
    assert np.mean(a != assign_split(ids, split, seed=8)) > 0.2


def test_assign_split_does_not_depend_on_row_order(split: SplitConfig) -> None:
    ids = pd.Series([f"us-001-{i:08d}" for i in range(2_000)])
    base = dict(zip(ids, assign_split(ids, split, seed=7), strict=True))
    perm = np.random.default_rng(0).permutation(len(ids))
    shuffled = ids.iloc[perm].reset_index(drop=True)
    again = dict(zip(shuffled, assign_split(shuffled, split, seed=7), strict=True))
    assert again == base
    # nor on which other rows share the shard
    half = ids.iloc[::2]
    assert dict(zip(half, assign_split(half, split, seed=7), strict=True)) == {k: base[k] for k in half}


# --------------------------------------------------------------------------- prepare_shard end to end
DATASET, JOB = "fraud", "job-42"


def _premake_dirs(root: Path) -> None:
    # prepare_shard writes Parquet through pyarrow, which does not create folders on a local store
    # (documented by test_prepare_shard_on_fresh_file_store below).
    (root / quarantine_prefix(DATASET, JOB)).mkdir(parents=True)
    for s in SPLITS:
        (root / prepared_prefix(DATASET, JOB) / s).mkdir(parents=True)


def test_prepare_shard_end_to_end(tmp_path: Path, conf: Conf, schema: SchemaConfig, split: SplitConfig) -> None:
    ds = conf.dataset
    good_shard, garbage_shard = ds.shard("apac-000"), ds.shard("apac-002")
    raw, n_bad = inject_malformed(generate("apac", 600, seed=11), 0.05, seed=12)
    (tmp_path / "raw/fraud").mkdir(parents=True)
    raw.to_parquet(tmp_path / good_shard.path, index=False)
    garbage = b"this is not parquet at all" * 10
    (tmp_path / garbage_shard.path).write_bytes(garbage)
    _premake_dirs(tmp_path)
    store = Store("file://" + str(tmp_path) + "/", {})

    rep = prepare_shard(store, good_shard, schema, split, 7, DATASET, JOB)
    assert rep.error is None
    assert (rep.rows_read, rep.rows_quarantined, rep.rows_prepared) == (600, n_bad, 600 - n_bad)
    qfile = tmp_path / quarantine_prefix(DATASET, JOB) / "apac-000.parquet"
    assert rep.quarantine_path == "file://" + str(qfile)
    quarantined = pd.read_parquet(qfile)
    assert len(quarantined) == n_bad
    assert quarantined[REASON].str.len().gt(0).all()
    assert set(quarantined["transaction_id"]) <= set(raw["transaction_id"])

    assert sum(rep.split_counts.values()) == rep.rows_prepared
    assert all(rep.split_counts[s] > 0 for s in SPLITS)
    assert rep.train_stats["n"] == rep.split_counts["train"]
    for s in SPLITS:
        assert (tmp_path / prepared_prefix(DATASET, JOB) / s / "apac-000.parquet").is_file()
        x, y = load_split(store, DATASET, JOB, s)
        assert x.shape == (rep.split_counts[s], len(feature_names(schema)))
        assert y.shape == (rep.split_counts[s],) and set(np.unique(y)) <= {0.0, 1.0}
    x_train, y_train = load_split(store, DATASET, JOB, "train")
    assert int(y_train.sum()) == rep.train_stats["label_counts"][1]
    assert sum(rep.train_stats["label_counts"]) == rep.train_stats["n"]
    assert np.allclose(x_train.sum(axis=0), rep.train_stats["sum"], rtol=1e-4)

    bad = prepare_shard(store, garbage_shard, schema, split, 7, DATASET, JOB)
    assert bad.error is not None and bad.error.startswith(f"unreadable shard {garbage_shard.path}")
    assert (bad.rows_read, bad.rows_prepared, bad.split_counts) == (0, 0, {})
    copied = tmp_path / quarantine_prefix(DATASET, JOB) / "apac-002.unreadable"
    assert bad.quarantine_path == "file://" + str(copied)
    assert copied.read_bytes() == garbage
    reason = json.loads((tmp_path / quarantine_prefix(DATASET, JOB) / "apac-002.reason.json").read_text())
    assert reason["shard"] == "apac-002" and reason["error"] == bad.error
    # the unreadable shard wrote nothing prepared
    assert not list((tmp_path / prepared_prefix(DATASET, JOB)).rglob("apac-002*"))

    summary = summarize([rep, bad])
    assert summary["rows_read"] == 600 and summary["rows_quarantined"] == n_bad
    assert summary["rows_prepared"] == 600 - n_bad
    assert summary["shards_unreadable"] == ["apac-002"]
    assert summary["split_counts"] == rep.split_counts
    assert summary["train_stats"]["n"] == rep.split_counts["train"]
    dumped = json.dumps(summary, default=str)
    assert "train_stats" not in summary["shards"]["apac-000"]
    for tid in raw["transaction_id"]:
        assert tid not in dumped
    assert "apac-000-" not in dumped  # no id prefix of any row either


def test_prepare_shard_missing_file_is_reported(tmp_path: Path, conf: Conf, schema: SchemaConfig) -> None:
    _premake_dirs(tmp_path)
    store = Store("file://" + str(tmp_path) + "/", {})
    rep = prepare_shard(store, conf.dataset.shard("eu-001"), schema, conf.training.split, 7, DATASET, JOB)
    assert rep.error is not None and rep.error.startswith("shard file not found")
    assert rep.quarantine_path is None
    assert (tmp_path / quarantine_prefix(DATASET, JOB) / "eu-001.reason.json").is_file()


def test_prepare_shard_schema_mismatch_quarantines_whole_shard(
    tmp_path: Path, conf: Conf, schema: SchemaConfig
) -> None:
    _premake_dirs(tmp_path)
    shard = conf.dataset.shard("eu-000")
    (tmp_path / "raw/fraud").mkdir(parents=True)
    generate("eu", 50, seed=0).drop(columns=["country"]).to_parquet(tmp_path / shard.path, index=False)
    store = Store("file://" + str(tmp_path) + "/", {})
    rep = prepare_shard(store, shard, schema, conf.training.split, 7, DATASET, JOB)
    assert rep.error is not None and "does not fit the schema" in rep.error
    assert (rep.rows_read, rep.rows_quarantined, rep.rows_prepared) == (50, 50, 0)
    q = pd.read_parquet(tmp_path / quarantine_prefix(DATASET, JOB) / "eu-000.parquet")
    assert len(q) == 50 and q[REASON].str.contains("missing columns").all()
    with pytest.raises(FileNotFoundError):
        load_split(store, DATASET, JOB, "train")


def test_prepare_shard_on_fresh_file_store(tmp_path: Path, conf: Conf, schema: SchemaConfig) -> None:
    shard = conf.dataset.shard("eu-000")
    (tmp_path / "raw/fraud").mkdir(parents=True)
    inject_malformed(generate("eu", 100, seed=0), 0.05, 1)[0].to_parquet(tmp_path / shard.path, index=False)
    store = Store("file://" + str(tmp_path) + "/", {})
    rep = prepare_shard(store, shard, schema, conf.training.split, 7, DATASET, JOB)
    assert rep.rows_prepared == 95


def test_a_numeric_column_is_transformed_only_as_its_schema_declares(schema: SchemaConfig) -> None:
    from insitu.conf import ColumnSpec, ConfigError  # noqa: F401  (ConfigError: the loader's wrapper)

    df = generate("eu", 5, seed=0)
    declared = schema.model_copy(update={"columns": {**schema.columns}})
    x_log, _ = featurize(df, declared)
    plain = {**schema.columns, "amount": schema.columns["amount"].model_copy(update={"transform": "none"})}
    x_raw, _ = featurize(df, schema.model_copy(update={"columns": plain}))
    i = feature_names(schema).index("amount")
    assert np.allclose(x_log[:, i], np.log1p(df["amount"].to_numpy()), rtol=1e-5)
    assert np.allclose(x_raw[:, i], df["amount"].to_numpy(), rtol=1e-5)
    with pytest.raises(ValueError, match="log1p needs a float or int column with min >= 0"):
        ColumnSpec(type="float", min=-5.0, transform="log1p")
