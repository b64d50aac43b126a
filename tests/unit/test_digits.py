"""The digits example: its per-site frames (deterministic, label-skewed, valid) and seeding by dataset into
``file://`` stores. That the shipped config trains it federatedly to a useful model: test_shipped_conf.py."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from deployments.platform import REPO
from insitu.data.digits import HOME_DIGITS, PIXELS, SITES, digits_frames
from insitu.data.features import assign_split, featurize
from insitu.data.schema import validate
from insitu.data.seed import SEEDERS, seed, seeder_for
from insitu.federated.kinds import MIN_ROWS
from insitu.job import JobSpec, load_job
from insitu.storage import Store

N_IMAGES = 1797  # sklearn.datasets.load_digits()


@pytest.fixture(scope="module")
def conf(conf_dir: Path) -> JobSpec:
    return load_job("digits", "digits", conf_dir)


@pytest.fixture(scope="module")
def frames() -> dict[str, pd.DataFrame]:
    return digits_frames(42)


def _store(c: JobSpec, site: str) -> Store:
    return Store(c.sites.site(site).storage, {})


# --------------------------------------------------------------------------- the frames
def test_frames_are_deterministic_per_seed(frames: dict[str, pd.DataFrame]) -> None:
    again = digits_frames(42)
    assert list(frames) == list(again) == list(SITES)
    for site in SITES:
        pd.testing.assert_frame_equal(frames[site], again[site])
    other = digits_frames(43)
    # Another seed sends other images to each site (the shares stay the same).
    assert set(other["eu"]["image_id"]) != set(frames["eu"]["image_id"])


def test_every_image_is_at_exactly_one_site_with_a_unique_id(frames: dict[str, pd.DataFrame]) -> None:
    ids = pd.concat([f["image_id"] for f in frames.values()])
    assert len(ids) == N_IMAGES and ids.is_unique
    # The same image (its index in scikit-learn's data) is never at two sites under two names.
    assert pd.Series([i.rsplit("-", 1)[1] for i in ids]).is_unique
    for site, f in frames.items():
        assert f["image_id"].str.startswith(f"{site}-d-").all()
        assert list(f.columns) == ["image_id", *PIXELS, "digit"]


def test_each_site_holds_mostly_its_own_digits(frames: dict[str, pd.DataFrame]) -> None:
    majority: dict[str, set[str]] = {}
    for site, f in frames.items():
        counts = f["digit"].value_counts()
        majority[site] = set(counts.index[counts > len(f) / 10])
        assert majority[site] == {str(d) for d in HOME_DIGITS[site]}, (site, counts.to_dict())
        # Every site still has some of every digit (skewed, not partitioned).
        assert set(counts.index) == {str(d) for d in range(10)}
    assert not (majority["eu"] & majority["us"]) and not (majority["us"] & majority["apac"])
    assert not (majority["eu"] & majority["apac"])
    per_digit = Counter(d for f in frames.values() for d in f["digit"])
    for site, f in frames.items():
        for d in HOME_DIGITS[site]:
            share = (f["digit"] == str(d)).sum() / per_digit[str(d)]
            assert 0.55 <= share <= 0.65, (site, d, share)


def test_frames_fit_the_digits_schema_and_each_site_keeps_a_test_split(
    conf: JobSpec, frames: dict[str, pd.DataFrame]
) -> None:
    ds, schema = conf.dataset, conf.dataset.schema_
    for site, f in frames.items():
        assert f[PIXELS].to_numpy().min() >= 0 and f[PIXELS].to_numpy().max() <= 16
        good, bad = validate(f, schema)
        assert len(bad) == 0, bad.head()
        assert len(good) == len(f)
        x, y = featurize(good, schema)
        assert x.shape == (len(f), 64)
        # The label is the digit's index in the schema's values, which are "0" … "9" in order.
        assert np.array_equal(y, f["digit"].astype(int).to_numpy(dtype=np.float32))
        which = assign_split(good[schema.id], conf.training.split, ds.split_key)
        assert (which == "test").sum() >= MIN_ROWS, site
        assert len(f) >= 300, site


# --------------------------------------------------------------------------- seeding by dataset
def test_seed_refuses_a_dataset_without_example_data(file_conf: Path, tmp_path: Path) -> None:
    assert sorted(SEEDERS) == ["card_sequences", "digits", "fraud"]
    path = file_conf / "datasets.yaml"
    data = yaml.safe_load(path.read_text())
    data["datasets"]["claims"] = data["datasets"]["fraud"]  # one's own dataset, however it looks
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    c = load_job("fraud", "claims", file_conf)
    with pytest.raises(ValueError) as info:
        seed(c)
    msg = str(info.value)
    assert "'claims'" in msg and "['card_sequences', 'digits', 'fraud']" in msg and "insitu data put" in msg, msg
    assert not (tmp_path / "stores").exists()  # refused before any store was touched
    with pytest.raises(ValueError, match="insitu data put"):
        seeder_for("x" * 500)


def test_seed_digits_writes_each_sites_frame_as_its_shard(file_conf: Path) -> None:
    c = load_job("digits", "digits", file_conf)
    out = seed(c, seed=42, corrupt_shard="last")  # the fraud-only knobs change nothing here
    frames = digits_frames(42)
    assert set(out) == {"eu-digits", "us-digits", "apac-digits"}
    for shard in c.dataset.shards:
        store = _store(c, shard.site)
        with store.fs.open(store.path(shard.path), "rb") as f:  # CSV: what a user would put there
            written = pd.read_csv(f, dtype={"digit": str})
        pd.testing.assert_frame_equal(written, frames[shard.site], check_dtype=False)
        info = out[shard.id]
        assert (info["site"], info["rows"], info["malformed"], info["unreadable"]) == (
            shard.site, len(frames[shard.site]), 0, False)
        assert info["mostly"] == [str(d) for d in HOME_DIGITS[shard.site]]


def test_seed_fraud_still_writes_malformed_rows_and_an_unreadable_shard(file_conf: Path) -> None:
    c = load_job("fraud", "fraud", file_conf)
    out = seed(c, rows_per_site=400, seed=1)
    last = c.dataset.shards[-1]
    assert out[last.id] == {"site": last.site, "rows": 0, "malformed": 0, "unreadable": True}
    with pytest.raises(Exception):  # noqa: B017 (whatever pyarrow calls it: the file is not Parquet)
        pd.read_parquet(_store(c, last.site).full_url(last.path))
    for shard in c.dataset.shards[:-1]:
        df = pd.read_parquet(_store(c, shard.site).full_url(shard.path))
        first = c.dataset.shards_of(shard.site)[0].id == shard.id
        assert out[shard.id]["rows"] == len(df) and (out[shard.id]["malformed"] > 0) == first
        _, bad = validate(df, c.dataset.schema_)
        assert len(bad) == out[shard.id]["malformed"]


def test_the_seed_command_refuses_an_unseedable_dataset_before_the_platform(tmp_path: Path) -> None:
    state = tmp_path / "state"
    r = subprocess.run([sys.executable, "-m", "deployments.cli", "seed", "--dataset", "claims", "--state-dir",
                        str(state)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={"PATH": "/usr/bin:/bin", "COLUMNS": "200", "PYTHONPATH": str(REPO)})
    out = (r.stdout + r.stderr).strip()
    assert r.returncode == 1 and out.startswith("error: ValueError: no example data for dataset 'claims'"), out
    assert "insitu data put" in out and not state.exists()
