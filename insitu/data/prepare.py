"""Prepare one site's shards on that site's Dask cluster.

One Dask task per shard: measure it against the site's limits (``insitu.data.limits``: before any parser
sees it), read (a CSV line by line, ``insitu.data.csv_lines``: a malformed line is quarantined with its line
number, never merged into its neighbours), validate, quarantine bad rows (with the reason) in the site's store,
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
from insitu.data.csv_lines import RULE_MALFORMED, MalformedLine, read_csv_lines
from insitu.data.features import featurize, label_classes
from insitu.data.limits import ShardLimits, check_shard
from insitu.data.schema import REASON, validate
from insitu.data.splits import split_of
from insitu.federated.stats import combine, partial_stats
from insitu.storage import Store, StoreUnavailable

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
    refused_rule: str | None = None
    """The site limit (``limits.*``) the shard was refused by, before parsing; stays on the site."""
    malformed_lines: list[int] = field(default_factory=list)
    """Line numbers of a CSV shard's malformed lines (the first 1,000); stays on the site."""


def prepared_prefix(dataset: str, job_id: str) -> str:
    return f"prepared/{dataset}/{job_id}"


def quarantine_prefix(dataset: str, job_id: str) -> str:
    return f"quarantine/{dataset}/{job_id}"


def _parent(store: Store, relative: str) -> None:
    """Create the parent folder on stores that have folders (object stores have none)."""
    if store.url.startswith("file://"):
        store.fs.makedirs(store.path(relative).rsplit("/", 1)[0], exist_ok=True)


def _read(store: Store, path: str) -> tuple[pd.DataFrame, list[MalformedLine]]:
    if path.endswith(".csv"):
        return read_csv_lines(store.fs.cat_file(store.path(path)))
    return pd.read_parquet(store.full_url(path), storage_options=store.open_options or None), []


def _refuse(store: Store, shard: ShardConfig, qprefix: str, rep: ShardReport, why: str, rule: str | None,
            detail: str) -> ShardReport:
    """Report a shard that cannot be read (or may not be: over a limit) and record why in its quarantine."""
    rep.error, rep.refused_rule = why, rule
    store.write_bytes(f"{qprefix}/{shard.id}.reason.json",  # one PUT: rides out an outage of the store
                      json.dumps({"shard": shard.id, "error": why, "rule": rule, "trace": detail[-2000:]}).encode())
    return rep


def _quarantine_lines(store: Store, shard: ShardConfig, qprefix: str, rep: ShardReport,
                      bad: list[MalformedLine]) -> None:
    """A CSV's malformed lines, with their numbers and reasons, in the site's quarantine."""
    qpath = f"{qprefix}/{shard.id}.malformed-lines.json"
    store.write_bytes(qpath, json.dumps({"shard": shard.id, "rule": RULE_MALFORMED, "lines": [
        {"line": m.line, "reason": m.reason, "text": m.text} for m in bad]}).encode())
    rep.malformed_lines = [m.line for m in bad][:1000]
    rep.reasons[RULE_MALFORMED] = len(bad)
    rep.quarantine_path = rep.quarantine_path or store.full_url(qpath)


def prepare_shard(
    store: Store,
    shard: ShardConfig,
    schema: SchemaConfig,
    split: SplitConfig,
    split_key: int,
    dataset: str,
    job_id: str,
    limits: ShardLimits | None = None,
) -> ShardReport:
    """Runs on a Dask worker of the shard's own site; ``limits`` are the site's (its policy's)."""
    rep = ShardReport(shard=shard.id)
    qprefix = quarantine_prefix(dataset, job_id)
    fs = store.fs
    try:
        over = check_shard(fs, store.path(shard.path), shard.id, limits or ShardLimits())
    except FileNotFoundError:
        return _refuse(store, shard, qprefix, rep, f"shard file not found: {store.full_url(shard.path)}", None, "")
    if over is not None:  # not copied to quarantine: an oversized file stays where it is, with its reason
        return _refuse(store, shard, qprefix, rep, over.message, over.rule, "")
    try:
        raw, malformed = store.ride_out(_read, store, shard.path, what=f"reading shard {shard.id}")
    except StoreUnavailable:
        raise  # the store is down, not the shard: nothing to quarantine, the run fails naming the store
    except Exception as e:  # unreadable: quarantine the file itself, report, let the others go on
        rep.quarantine_path = store.full_url(f"{qprefix}/{shard.id}.unreadable")
        _parent(store, f"{qprefix}/{shard.id}.unreadable")
        fs.copy(store.path(shard.path), store.path(f"{qprefix}/{shard.id}.unreadable"))
        return _refuse(store, shard, qprefix, rep, f"unreadable shard {shard.path}: {type(e).__name__}: {e}", None,
                       traceback.format_exc())
    rep.rows_read = len(raw) + len(malformed)
    try:
        good, bad = validate(raw, schema)
    except ValueError as e:
        rep.error = f"shard {shard.path} does not fit the schema: {e}"
        good, bad = raw.iloc[0:0], raw.assign(_quarantine_reason=str(e))
    if len(bad):
        qpath = f"{qprefix}/{shard.id}.parquet"
        _parent(store, qpath)
        bad.to_parquet(store.full_url(qpath), storage_options=store.open_options or None, index=False)
        rep.quarantine_path = store.full_url(qpath)
    if len(bad) and REASON in bad.columns:
        rep.reasons = {str(k): int(v) for k, v in bad[REASON].value_counts().head(5).items()}
    if malformed:
        _quarantine_lines(store, shard, qprefix, rep, malformed)
    rep.rows_quarantined = len(bad) + len(malformed)
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
            store.full_url(f"{prefix}/{name}/{shard.id}.parquet"), storage_options=store.open_options or None,
            index=False, row_group_size=ROW_GROUP_ROWS,
        )
        rep.split_counts[name] = int(m.sum())
        if name == "train":
            rep.train_stats = partial_stats(x[m], y[m], label_classes(schema))
    return rep


_SITE_ONLY = ("train_stats", "shard", "reasons", "refused_rule", "malformed_lines")


def summarize(reports: list[ShardReport]) -> dict[str, Any]:
    """What a site may publish about its preparation: counts and aggregate statistics only."""
    return {
        "shards": {r.shard: {k: v for k, v in asdict(r).items() if k not in _SITE_ONLY}
                   for r in reports},
        "rows_read": sum(r.rows_read for r in reports),
        "rows_prepared": sum(r.rows_prepared for r in reports),
        "rows_quarantined": sum(r.rows_quarantined for r in reports),
        "shards_unreadable": [r.shard for r in reports if r.error],
        "split_counts": {s: sum(r.split_counts.get(s, 0) for r in reports) for s in SPLITS},
        "train_stats": combine(r.train_stats for r in reports),
    }
