"""Turn validated rows into a float feature matrix. Same code on every site, so columns line up."""

from __future__ import annotations

import numpy as np
import pandas as pd

from insitu.conf import SchemaConfig, SplitConfig


def feature_names(schema: SchemaConfig) -> list[str]:
    names: list[str] = []
    for name, spec in schema.feature_columns.items():
        if spec.type == "category":
            names += [f"{name}={v}" for v in spec.values or []]
        elif spec.type in ("float", "int", "bool"):
            names.append(name)
    return names


def featurize(df: pd.DataFrame, schema: SchemaConfig) -> tuple[np.ndarray, np.ndarray]:
    """Features ``X`` (float32) and labels ``y`` (float32) from validated rows.

    A numeric column is transformed only as its schema declares (``transform: log1p`` for heavy-tailed
    non-negatives such as amounts; ``none`` by default); categories are one-hot over the schema's fixed
    vocabulary; global standardisation happens in the model.
    """
    cols: list[np.ndarray] = []
    for name, spec in schema.feature_columns.items():
        v = df[name]
        if spec.type == "category":
            s = v.astype(str).to_numpy()
            cols += [(s == cat).astype(np.float32) for cat in spec.values or []]
        elif spec.type in ("float", "int"):
            x = v.to_numpy(dtype=np.float64)
            cols.append(np.log1p(x) if spec.transform == "log1p" else x)
        elif spec.type == "bool":
            cols.append(v.to_numpy(dtype=np.float64))
    x = np.stack(cols, axis=1).astype(np.float32) if len(df) else np.zeros((0, len(feature_names(schema))), np.float32)
    return x, encode_label(df[schema.label], schema)


def label_classes(schema: SchemaConfig) -> int | None:
    """How many classes the label has (2 for bool, the list's length for category), None for a number."""
    spec = schema.columns[schema.label]
    if spec.type == "bool":
        return 2
    if spec.type == "category":
        return len(spec.values or [])
    return None


def encode_label(values: pd.Series, schema: SchemaConfig) -> np.ndarray:
    """The label as float32: 0/1 for bool, the index in the schema's list for category, the value otherwise."""
    spec = schema.columns[schema.label]
    if spec.type == "category":
        index = {v: i for i, v in enumerate(spec.values or [])}
        return values.astype(str).map(index).to_numpy(dtype=np.float32)
    return values.to_numpy(dtype=np.float32)


def assign_split(ids: pd.Series, split: SplitConfig, seed: int) -> np.ndarray:
    """Deterministic train/val/test assignment by a keyed hash of the row id.

    The same row always lands in the same split, whatever the shard layout or the number of workers.
    """
    key = f"insitu{seed:010d}"[:16]
    h = pd.util.hash_pandas_object(ids.astype(str), index=False, hash_key=key).to_numpy()
    u = (h % np.uint64(1_000_000)).astype(np.float64) / 1_000_000.0
    out = np.full(len(ids), "test", dtype=object)
    out[u < split.train + split.val] = "val"
    out[u < split.train] = "train"
    return out
