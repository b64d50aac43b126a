"""split_of / split_rows say which split each row is in: exactly the rows preparation writes to each split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from insitu.conf import Conf, SchemaConfig, ShardConfig, SplitConfig, load_conf
from insitu.data import split_of, split_rows
from insitu.data.features import featurize
from insitu.data.loader import load_split
from insitu.data.prepare import SPLITS, prepare_shard, prepared_prefix
from insitu.data.synthetic import generate, inject_malformed
from insitu.storage import Store

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
JOB = "job-split"


@pytest.fixture(scope="module")
def conf() -> Conf:
    return load_conf("fraud", directory=CONF_DIR)


def _prepared(tmp_path: Path, frame: pd.DataFrame, schema: SchemaConfig, shard: ShardConfig, split: SplitConfig,
              split_key: int, dataset: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Run the real preparation on ``frame`` written as ``shard``'s file; each split's prepared ``(X, y)``."""
    path = tmp_path / shard.path
    path.parent.mkdir(parents=True, exist_ok=True)
    if shard.path.endswith(".csv"):
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False)
    store = Store(f"file://{tmp_path}/", {})
    rep = prepare_shard(store, shard, schema, split, split_key, dataset, JOB)
    assert rep.error is None and rep.rows_quarantined > 0  # the quarantine path ran too
    assert (tmp_path / prepared_prefix(dataset, JOB)).is_dir()
    return {s: load_split(store, dataset, JOB, s) for s in SPLITS}


def test_prepared_splits_hold_exactly_the_rows_split_rows_assigns_them(tmp_path: Path, conf: Conf) -> None:
    schema, split, key = conf.dataset.schema_, conf.training.split, 11
    raw, _ = inject_malformed(generate("eu", 800, seed=3), 0.05, seed=4)
    prepared = _prepared(tmp_path, raw, schema, conf.dataset.shard("eu-000"), split, key, "fraud")
    rows = split_rows(pd.read_parquet(tmp_path / conf.dataset.shard("eu-000").path), schema, split_key=key,
                      split=split)
    assert set(rows["split"]) == set(SPLITS)
    for s in SPLITS:
        x, y = featurize(rows[rows["split"] == s].drop(columns="split"), schema)
        px, py = prepared[s]
        # the same rows, in the same order, with the same features: a baseline's test rows are the sites'
        np.testing.assert_array_equal(px, x)
        np.testing.assert_array_equal(py, y)
    # split_of on the ids alone agrees with the frame's split
    assert list(split_of(rows[schema.id], split_key=key, split=split)) == list(rows["split"])


def test_split_rows_agrees_with_preparation_where_the_raw_id_column_reads_as_float(tmp_path: Path) -> None:
    # An int id with a missing value reads from CSV as float ("7.0"); validation quarantines that row and
    # gives the others int ids ("7"), which is what preparation hashes. split_rows validates first.
    schema = SchemaConfig.model_validate({"id": "rid", "label": "y", "columns": {
        "rid": {"type": "int"}, "x": {"type": "float"}, "y": {"type": "float", "min": 0}}})
    n = 600
    frame = pd.DataFrame({"rid": np.arange(n, dtype=np.float64) * 7, "x": np.arange(n) + 0.5,
                          "y": np.ones(n)})
    frame.loc[5, "rid"] = np.nan
    shard = ShardConfig(id="s-0", site="eu", path="raw/ints.csv")
    split = SplitConfig(train=0.5, val=0.2, test=0.3)
    prepared = _prepared(tmp_path, frame, schema, shard, split, 3, "ints")
    raw = pd.read_csv(tmp_path / shard.path)
    assert raw["rid"].dtype == np.float64
    rows = split_rows(raw, schema, split_key=3, split=split)
    assert len(rows) == n - 1
    for s in SPLITS:
        # x is the row's position: the prepared rows of split s, identified one by one
        assert list(prepared[s][0][:, 0]) == list(rows.loc[rows["split"] == s, "x"].astype(np.float32))
    # the ids as validation types them, in any container, give the same answer
    as_ints = rows["rid"].to_numpy()
    assert list(split_of(as_ints, split_key=3, split=split)) == list(rows["split"])
    assert list(split_of([int(i) for i in as_ints], split_key=3, split={"train": 0.5, "val": 0.2, "test": 0.3})) \
        == list(rows["split"])
    # the raw float ids hash as other text: that is why split_rows exists
    assert list(split_of(raw["rid"].dropna(), split_key=3, split=split)) != list(rows["split"])


def test_split_of_depends_on_the_key_and_fractions_only() -> None:
    ids = [f"id-{i}" for i in range(5000)]
    split = SplitConfig()
    base = split_of(ids, split_key=0, split=split)
    assert base.shape == (5000,) and set(base) == set(SPLITS)
    assert np.mean(base == "test") == pytest.approx(0.15, abs=0.02)
    assert list(split_of(reversed(ids), split_key=0, split=split)) == list(base[::-1])  # order does not matter
    assert np.mean(split_of(ids, split_key=1, split=split) != base) > 0.2  # another dataset key, other rows
    assert list(split_of(pd.Series(ids, index=range(100, 5100)), split_key=0, split=split)) == list(base)


def test_split_of_refuses_fractions_that_do_not_add_up_and_split_rows_a_taken_column(conf: Conf) -> None:
    with pytest.raises(ValueError, match="must equal 1.0"):
        split_of(["a"], split_key=0, split={"train": 0.7, "val": 0.2, "test": 0.2})
    frame = generate("eu", 5, seed=0).assign(split="x")
    with pytest.raises(ValueError, match="already has a column 'split'"):
        split_rows(frame, conf.dataset.schema_, split_key=0, split=conf.training.split)


def test_the_documented_central_baseline_runs_on_the_test_rows() -> None:
    from examples.central_baseline import central_baseline

    result = central_baseline(rows_per_shard=1500)
    assert 0.1 * 4500 < result["test_rows"] < 0.2 * 4500  # fraud.yaml's test fraction is 0.15
    assert result["roc_auc"] > 0.7  # a linear model finds the generator's signal
