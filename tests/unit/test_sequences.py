"""The card-sequence example (``insitu/data/sequences.py``): deterministic and non-IID frames that fit
the ``card_sequences`` schema of ``datasets.yaml``, step-major features, a label that needs the sequence,
the step layout check, and seeding into ``file://`` stores."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from insitu.conf import SchemaConfig, load_conf, load_datasets
from insitu.data.features import feature_names, featurize
from insitu.data.schema import validate
from insitu.data.seed import seed
from insitu.data.sequences import (
    LABEL_COLUMN,
    SEQ_LEN,
    STEP_COLUMNS,
    check_matches_schema,
    columns,
    generate,
    step_features,
)
from insitu.data.synthetic import CATEGORIES
from insitu.storage import Store

K = 4 + len(CATEGORIES)  # amount, hour, foreign, online + the one-hot merchant category


@pytest.fixture(scope="module")
def schema(conf_dir: Path) -> SchemaConfig:
    return load_datasets(conf_dir / "datasets.yaml", only="card_sequences").datasets["card_sequences"].schema_


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return generate("us", 3000, 7)


# --------------------------------------------------------------------------- the frames
def test_frames_are_deterministic_per_seed_and_differ_per_seed_site_and_shard(frame: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(frame, generate("us", 3000, 7))
    assert len(frame) == 3000 and frame["transaction_id"].is_unique
    assert not frame.equals(generate("us", 3000, 8))
    # Shards of one site are other cards: ids never collide.
    assert not set(frame["transaction_id"]) & set(generate("us", 3000, 7, shard=1)["transaction_id"])
    assert len(generate("eu", 0, 7)) == 0 and list(generate("eu", 0, 7).columns) == columns()


def test_sites_differ(frame: pd.DataFrame) -> None:
    """Non-IID: amounts, category mix and fraud rate follow each site's profile."""
    sites = {"us": frame, "eu": generate("eu", 3000, 7), "apac": generate("apac", 3000, 7)}
    last = f"amount_t{SEQ_LEN - 1}"
    median = {s: f[last].median() for s, f in sites.items()}
    assert median["apac"] < median["eu"] < median["us"], median
    rate = {s: f[LABEL_COLUMN].mean() for s, f in sites.items()}
    assert all(0.01 <= r <= 0.07 for r in rate.values()), rate
    assert rate["us"] > rate["eu"], rate
    mix = {s: f[f"merchant_category_t{SEQ_LEN - 1}"].value_counts(normalize=True) for s, f in sites.items()}
    assert abs(mix["eu"]["grocery"] - mix["us"]["grocery"]) > 0.04, mix


def test_rows_are_windows_of_one_card_history(frame: pd.DataFrame) -> None:
    """Row j+1 of a card is row j shifted by one step: step t of the next row is step t+1 of this one."""
    card = frame["transaction_id"].str.rsplit("-", n=1).str[0]
    same = (card.to_numpy()[1:] == card.to_numpy()[:-1])
    assert same.mean() > 0.9  # rows come card by card
    for name in STEP_COLUMNS:
        for t in range(SEQ_LEN - 1):
            nxt = frame[f"{name}_t{t}"].to_numpy()[1:][same]
            assert np.array_equal(nxt, frame[f"{name}_t{t + 1}"].to_numpy()[:-1][same]), (name, t)


def test_frames_fit_the_card_sequences_schema(schema: SchemaConfig, frame: pd.DataFrame) -> None:
    assert list(frame.columns) == list(schema.columns) == columns()
    check_matches_schema(schema)  # what the seeder checks first
    for site in ("eu", "us", "apac"):
        f = frame if site == "us" else generate(site, 1500, 3)
        good, bad = validate(f, schema)
        assert len(bad) == 0, bad.head()
        assert len(good) == len(f)


def test_featurize_is_step_major_with_k_features_per_step(schema: SchemaConfig, frame: pd.DataFrame) -> None:
    good, _ = validate(frame, schema)
    x, y = featurize(good, schema)
    assert step_features(schema) == K
    assert x.shape == (len(frame), SEQ_LEN * K)
    steps = x.reshape(len(frame), SEQ_LEN, K)  # what a sequence model does
    for t in range(SEQ_LEN):
        assert np.allclose(steps[:, t, 0], np.log1p(frame[f"amount_t{t}"]), rtol=1e-5)
        assert np.array_equal(steps[:, t, 1], frame[f"hour_t{t}"])
        assert np.array_equal(steps[:, t, 2], frame[f"foreign_t{t}"])
        assert np.array_equal(steps[:, t, 3], frame[f"online_t{t}"])
        one_hot = steps[:, t, 4:]
        assert np.array_equal(one_hot.argmax(axis=1), frame[f"merchant_category_t{t}"].map(CATEGORIES.index))
        assert np.all(one_hot.sum(axis=1) == 1)
    assert np.array_equal(y, frame[LABEL_COLUMN].to_numpy(dtype=np.float32))


def test_the_label_needs_the_sequence(schema: SchemaConfig) -> None:
    """A logistic regression on all L steps ranks fraud clearly better than one on the current transaction."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    train = pd.concat([generate(s, 4000, 1) for s in ("eu", "us", "apac")], ignore_index=True)
    test = pd.concat([generate(s, 4000, 2) for s in ("eu", "us", "apac")], ignore_index=True)
    (x_tr, y_tr), (x_te, y_te) = featurize(train, schema), featurize(test, schema)
    assert 150 < y_te.sum() < 600  # a few percent
    auc = {}
    for name, cols in (("sequence", slice(None)), ("last step", slice((SEQ_LEN - 1) * K, None))):
        model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(x_tr[:, cols], y_tr)
        auc[name] = roc_auc_score(y_te, model.predict_proba(x_te[:, cols])[:, 1])
    assert auc["last step"] > 0.75, auc  # the current transaction says something ...
    assert auc["sequence"] >= auc["last step"] + 0.04, auc  # ... its history says clearly more


# --------------------------------------------------------------------------- the step layout check
def _reordered(schema: SchemaConfig, names: list[str]) -> SchemaConfig:
    return SchemaConfig.model_validate({"id": schema.id, "label": schema.label,
                                        "columns": {n: schema.columns[n].model_dump() for n in names}})


def test_step_features_accepts_the_schema_and_rejects_a_shuffled_one(schema: SchemaConfig, conf_dir: Path) -> None:
    assert step_features(schema) == K == len(feature_names(schema)) // SEQ_LEN
    names = list(schema.columns)
    # Step 3 lists hour before amount: same columns, other order.
    i, j = names.index("amount_t3"), names.index("hour_t3")
    swapped = names.copy()
    swapped[i], swapped[j] = swapped[j], swapped[i]
    with pytest.raises(ValueError) as info:
        step_features(_reordered(schema, swapped))
    msg = str(info.value)
    assert "feature 36 is 'hour_t3'" in msg and "expected 'amount_t3'" in msg, msg
    with pytest.raises(ValueError, match="must repeat"):
        check_matches_schema(_reordered(schema, swapped))
    # Steps out of order: t1's block before t0's.
    t0 = [n for n in names if n.endswith("_t0")]
    t1 = [n for n in names if n.endswith("_t1")]
    rest = [n for n in names if n not in t0 + t1]
    with pytest.raises(ValueError, match="feature 0 is 'amount_t1'"):
        step_features(_reordered(schema, [rest[0], *t1, *t0, *rest[1:]]))
    # A column missing from one step: the features are no longer L equal blocks.
    with pytest.raises(ValueError, match="not a multiple of 8"):
        step_features(_reordered(schema, [n for n in names if n != "online_t5"]))
    # The fraud schema is not a sequence at all.
    fraud = load_datasets(conf_dir / "datasets.yaml", only="fraud").datasets["fraud"].schema_
    with pytest.raises(ValueError):
        step_features(fraud)


# --------------------------------------------------------------------------- seeding
def test_seed_card_sequences_writes_clean_shards_per_site(file_conf: Path) -> None:
    # No training config of its own yet: the pair is checked with fraud's, as `insitu seed` does.
    c = load_conf("fraud", "card_sequences", file_conf)
    out = seed(c, rows_per_site=900, seed=5, corrupt_shard="last", malformed_fraction=0.1)
    assert {s.site for s in c.dataset.shards} == {"eu", "us", "apac"}
    assert set(out) == {s.id for s in c.dataset.shards}
    for site in ("eu", "us", "apac"):
        shards = c.dataset.shards_of(site)
        assert sum(out[s.id]["rows"] for s in shards) == 900
    for shard in c.dataset.shards:
        store = Store(c.sites.site(shard.site).storage, {})
        df = pd.read_parquet(store.full_url(shard.path))
        info = out[shard.id]
        assert (info["site"], info["rows"], info["malformed"], info["unreadable"]) == (shard.site, len(df), 0, False)
        good, bad = validate(df, c.dataset.schema_)
        assert len(bad) == 0 and len(good) == len(df)
        i = [s.id for s in c.dataset.shards_of(shard.site)].index(shard.id)
        pd.testing.assert_frame_equal(df, generate(shard.site, len(df), 5, shard=i))
