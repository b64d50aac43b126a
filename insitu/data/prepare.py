"""Prepare one site's shards on that site's Dask cluster.

One Dask task per shard: read, validate, quarantine bad rows (with the reason) in the site's store,
featurize, split deterministically and write the prepared splits back to the site's store. A shard
that cannot be read is copied to quarantine and reported; the other shards go on. Only aggregate
statistics leave this module.
"""

from __future__ import annotations

import json
import logging
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from insitu.conf import SchemaConfig, ShardConfig, SplitConfig
from insitu.data.features import featurize, label_classes
from insitu.data.schema import REASON, validate
from insitu.data.splits import split_of
from insitu.federated.stats import combine, partial_stats
from insitu.storage import Store

log = logging.getLogger(__name__)
SPLITS = ("train", "val", "test")
# Prepared files are written in row groups of this many rows: a training rank reads only the row groups
# that overlap its block of the split (insitu.data.loader.load_rank_part), so it reads at most about one
# group beyond its own rows.
ROW_GROUP_ROWS = 8192


@dataclass
class ShardReport:
    shard: str
    rows_read: int = 0
    rows_prepared: int = 0
    rows_quarantined: int = 0
    split_counts: dict[str, int] = field(default_factory=dict)
    train_stats: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    quarantine_path: str | None = None
    reasons: dict[str, int] = field(default_factory=dict)
    """Quarantined rows per schema rule (rule names only, never values); stays on the site."""


def prepared_prefix(dataset: str, job_id: str) -> str:
    return f"prepared/{dataset}/{job_id}"


def quarantine_prefix(dataset: str, job_id: str) -> str:
    return f"quarantine/{dataset}/{job_id}"


def _parent(store: Store, relative: str) -> None:
    """Create the parent folder on stores that have folders (object stores have none)."""
    if store.url.startswith("file://"):
        store.fs.makedirs(store.path(relative).rsplit("/", 1)[0], exist_ok=True)


def _read(store: Store, path: str) -> pd.DataFrame:
    url = store.full_url(path)
    if path.endswith(".csv"):
        return pd.read_csv(url, storage_options=store.options or None)
    return pd.read_parquet(url, storage_options=store.options or None)


def prepare_shard(
    store: Store,
    shard: ShardConfig,
    schema: SchemaConfig,
    split: SplitConfig,
    split_key: int,
    dataset: str,
    job_id: str,
) -> ShardReport:
    """Runs on a Dask worker of the shard's own site."""
    rep = ShardReport(shard=shard.id)
    qprefix = quarantine_prefix(dataset, job_id)
    fs = store.fs
    try:
        raw = _read(store, shard.path)
    except Exception as e:  # unreadable: quarantine the file itself, report, let the others go on
        rep.error = f"unreadable shard {shard.path}: {type(e).__name__}: {e}"
        rep.quarantine_path = store.full_url(f"{qprefix}/{shard.id}.unreadable")
        _parent(store, f"{qprefix}/{shard.id}.unreadable")
        try:
            fs.copy(store.path(shard.path), store.path(f"{qprefix}/{shard.id}.unreadable"))
        except FileNotFoundError:
            rep.error = f"shard file not found: {store.full_url(shard.path)}"
            rep.quarantine_path = None
        with fs.open(store.path(f"{qprefix}/{shard.id}.reason.json"), "w") as f:
            f.write(json.dumps({"shard": shard.id, "error": rep.error, "trace": traceback.format_exc()[-2000:]}))
        return rep
    rep.rows_read = len(raw)
    try:
        good, bad = validate(raw, schema)
    except ValueError as e:
        rep.error = f"shard {shard.path} does not fit the schema: {e}"
        good, bad = raw.iloc[0:0], raw.assign(_quarantine_reason=str(e))
    if len(bad):
        qpath = f"{qprefix}/{shard.id}.parquet"
        _parent(store, qpath)
        bad.to_parquet(store.full_url(qpath), storage_options=store.options or None, index=False)
        rep.quarantine_path = store.full_url(qpath)
    if len(bad) and REASON in bad.columns:
        rep.reasons = {str(k): int(v) for k, v in bad[REASON].value_counts().head(5).items()}
    rep.rows_quarantined = len(bad)
    rep.rows_prepared = len(good)
    if len(good) == 0:
        return rep
    x, y = featurize(good, schema)
    # The public split_of, so that a central baseline's split of the rows cannot differ from this one.
    which = split_of(good[schema.id], split_key=split_key, split=split)
    prefix = prepared_prefix(dataset, job_id)
    for name in SPLITS:
        m = which == name
        frame = pd.DataFrame(x[m], columns=[f"f{i}" for i in range(x.shape[1])])
        frame["label"] = y[m]
        _parent(store, f"{prefix}/{name}/{shard.id}.parquet")
        frame.to_parquet(
            store.full_url(f"{prefix}/{name}/{shard.id}.parquet"), storage_options=store.options or None, index=False,
            row_group_size=ROW_GROUP_ROWS,
        )
        rep.split_counts[name] = int(m.sum())
        if name == "train":
            rep.train_stats = partial_stats(x[m], y[m], label_classes(schema))
    return rep


def summarize(reports: list[ShardReport]) -> dict[str, Any]:
    """What a site may publish about its preparation: counts and aggregate statistics only."""
    return {
        "shards": {r.shard: {k: v for k, v in asdict(r).items() if k not in ("train_stats", "shard", "reasons")}
                   for r in reports},
        "rows_read": sum(r.rows_read for r in reports),
        "rows_prepared": sum(r.rows_prepared for r in reports),
        "rows_quarantined": sum(r.rows_quarantined for r in reports),
        "shards_unreadable": [r.shard for r in reports if r.error],
        "split_counts": {s: sum(r.split_counts.get(s, 0) for r in reports) for s in SPLITS},
        "train_stats": combine(r.train_stats for r in reports),
    }
