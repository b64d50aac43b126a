"""The digits example: its per-site frames (deterministic, label-skewed, valid), seeding by dataset into
``file://`` stores, and that the shipped config trains it federatedly to a useful model."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from deployments.platform import REPO
from insitu.data.digits import HOME_DIGITS, PIXELS, SITES, digits_frames
from insitu.data.features import assign_split, featurize, label_classes
from insitu.data.loader import load_split
from insitu.data.prepare import prepare_shard, summarize
from insitu.data.schema import validate
from insitu.data.seed import SEEDERS, seed, seeder_for
from insitu.federated.aggregators import Update, build_aggregator
from insitu.federated.kinds import MIN_ROWS
from insitu.federated.stats import combine, mean_std
from insitu.job import JobSpec, load_job
from insitu.models import Normalization, build_model
from insitu.parallel.loop import train_epochs
from insitu.storage import Store

N_IMAGES = 1797  # sklearn.datasets.load_digits()


@pytest.fixture(scope="module")
def conf() -> JobSpec:
    return load_job("digits", "digits", REPO / "conf")


@pytest.fixture(scope="module")
def frames() -> dict[str, pd.DataFrame]:
    return digits_frames(42)


@pytest.fixture
def file_conf(tmp_path: Path) -> Path:
    """A copy of ``conf/`` whose sites and exchange are folders under ``tmp_path`` (no platform needed)."""
    d = tmp_path / "conf"
    shutil.copytree(REPO / "conf", d, ignore=shutil.ignore_patterns("e2e-*"))
    sites = yaml.safe_load((d / "sites.yaml").read_text())
    sites["exchange"]["storage"] = f"file://{tmp_path}/exchange/"
    for s in sites["sites"]:
        s["storage"] = f"file://{tmp_path}/stores/{s['name']}/"
    (d / "sites.yaml").write_text(yaml.safe_dump(sites, sort_keys=False))
    return d


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


# --------------------------------------------------------------------------- it trains
def test_the_shipped_config_trains_the_seeded_digits_federatedly(file_conf: Path) -> None:
    """seed → prepare on each site's store → FedAvg rounds in-process, as the sites and coordinator run them:
    the global test macro-F1 after the configured rounds must clear the gate's first-model floor by far."""
    c = load_job("digits", "digits", file_conf)
    t, task, schema = c.training, c.task, c.dataset.schema_
    seed(c, seed=42)
    data = {}
    for shard in c.dataset.shards:
        store = _store(c, shard.site)
        rep = prepare_shard(store, shard, schema, t.split, c.dataset.split_key, "digits", "job-1")
        assert rep.error is None and rep.rows_quarantined == 0
        data[shard.site] = (summarize([rep]), {s: load_split(store, "digits", "job-1", s) for s in ("train", "test")})
    stats = combine(d[0]["train_stats"] for d in data.values())
    assert sum(stats["label_counts"]) == stats["n"] and len(stats["label_counts"]) == label_classes(schema) == 10
    mean, std = mean_std(stats)
    params = task.loss_params(stats)
    torch.manual_seed(t.seed)
    state = build_model(t.model, len(mean), task.n_outputs, Normalization(mean, std)).state_dict()
    agg = build_aggregator(t.aggregator.name, t.aggregator.options)
    kept = None
    for rnd in range(t.rounds):
        updates = []
        for site, (_, splits) in data.items():
            model = build_model(t.model, len(mean), task.n_outputs)
            model.load_state_dict(state)
            train_epochs(model, *splits["train"], t, task.loss(params), t.seed * 1000 + rnd)
            updates.append(Update(site, model.state_dict(), len(splits["train"][1])))
        state, kept = agg.aggregate(rnd, state, updates, kept)
    per_site = {}
    for site, (_, splits) in data.items():
        model = build_model(t.model, len(mean), task.n_outputs)
        model.load_state_dict(state)
        model.eval()
        x, y = splits["test"]
        with torch.no_grad():
            per_site[site] = task.site_metrics(model(torch.from_numpy(x)), y, params)
    g = task.global_metrics(per_site)
    assert g["count"] == sum(len(d[1]["test"][1]) for d in data.values())
    assert g["macro_f1"] >= 0.85, (g, {s: m["macro_f1"] for s, m in per_site.items()})
    assert all(m["macro_f1"] >= 0.8 for m in per_site.values()), per_site
    assert task.gate_metric(t.gate.primary_metric).meets(g["macro_f1"], t.gate.absolute_floor)
