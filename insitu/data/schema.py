"""Validate a shard against the dataset schema, splitting good rows from quarantined ones."""

from __future__ import annotations

import difflib

import numpy as np
import pandas as pd

from insitu.conf import SchemaConfig

REASON = "_quarantine_reason"


class SchemaError(ValueError):
    """The shard as a whole does not fit the schema (e.g. a column is missing)."""


def validate(df: pd.DataFrame, schema: SchemaConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return ``(good, bad)``; ``bad`` carries a ``_quarantine_reason`` column naming the first fault.

    Good rows come back with canonical dtypes (float64, int64, bool, str). Raises
    :class:`SchemaError` when a column is missing, since then no row can be trusted.
    """
    missing = [c for c in schema.columns if c not in df.columns]
    if missing:
        unexpected = [str(c) for c in df.columns if c not in schema.columns]
        hints = [f"{m!r} (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(m, unexpected, n=1))
                 else repr(m) for m in missing]
        raise SchemaError(f"missing columns {', '.join(hints)}; the file has unexpected columns {unexpected}; "
                          "rename the file's columns or fix the dataset's schema in conf/datasets.yaml")
    reason = pd.Series("", index=df.index, dtype=object)
    clean: dict[str, pd.Series] = {}

    def flag(mask: pd.Series | np.ndarray, text: str) -> None:
        m = np.asarray(mask, dtype=bool) & (reason.to_numpy() == "")
        reason[m] = text

    for name, spec in schema.columns.items():
        col = df[name]
        null = col.isna().to_numpy()
        if not spec.nullable:
            flag(null, f"{name}: missing value")
        if spec.type in ("float", "int"):
            num = pd.to_numeric(col, errors="coerce")
            flag(num.isna().to_numpy() & ~null, f"{name}: not a number")
            if spec.type == "int":
                flag((num.notna() & (num != num.round())).to_numpy(), f"{name}: not an integer")
            if spec.min is not None:
                flag((num < spec.min).to_numpy(), f"{name}: below minimum {spec.min:g}")
            if spec.max is not None:
                flag((num > spec.max).to_numpy(), f"{name}: above maximum {spec.max:g}")
            clean[name] = num
        elif spec.type == "category":
            s = col.astype("string")
            flag((~s.isin(spec.values or []) & s.notna()).to_numpy(), f"{name}: value not in the schema's list")
            clean[name] = s
        elif spec.type == "bool":
            ok = col.isin([True, False, 0, 1]) | col.isna()
            flag(~ok.to_numpy(), f"{name}: not a boolean")
            clean[name] = col
        else:
            clean[name] = col.astype("string")
    if df[schema.id].duplicated().any():
        flag(df[schema.id].duplicated().to_numpy(), f"{schema.id}: duplicate id in shard")

    bad_mask = reason.to_numpy() != ""
    good = pd.DataFrame({k: v[~bad_mask] for k, v in clean.items()})
    for name, spec in schema.columns.items():
        if spec.type == "float":
            good[name] = good[name].astype("float64")
        elif spec.type == "int":
            good[name] = good[name].astype("int64")
        elif spec.type == "bool":
            good[name] = good[name].astype(bool)
        else:
            good[name] = good[name].astype(str)
    bad = df[bad_mask].copy()
    bad[REASON] = reason[bad_mask].astype(str)
    # Keep quarantined rows writable as Parquet whatever their mixed types were.
    for c in bad.columns:
        if bad[c].dtype == object:
            bad[c] = bad[c].astype(str)
    return good.reset_index(drop=True), bad.reset_index(drop=True)
