"""Load a site's prepared split into memory as tensors."""

from __future__ import annotations

import numpy as np
import pandas as pd

from insitu.data.prepare import prepared_prefix
from insitu.storage import Store


def load_split(store: Store, dataset: str, job_id: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` for one split of the site's prepared data (all shards, in shard order)."""
    prefix = store.path(f"{prepared_prefix(dataset, job_id)}/{split}")
    fs = store.fs
    files = sorted(fs.glob(prefix + "/*.parquet")) if fs.exists(prefix) else []
    if not files:
        raise FileNotFoundError(f"no prepared {split} data at {store.full_url(prepared_prefix(dataset, job_id))}")
    proto = store.url.split("://", 1)[0]
    frames = [pd.read_parquet(f"{proto}://{f}", storage_options=store.options or None) for f in files]
    df = pd.concat(frames, ignore_index=True)
    y = df.pop("label").to_numpy(dtype=np.float32)
    return df.to_numpy(dtype=np.float32), y


_CACHE: dict[tuple[str, str, str, str], tuple[np.ndarray, np.ndarray]] = {}
_CACHE_SIZE = 4


def load_split_cached(store: Store, dataset: str, job_id: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """:func:`load_split`, kept in this process for later rounds of the same job.

    A site's Dask workers live across rounds, so each rank reads its job's prepared split from the
    store once instead of once per round. Prepared data of a job is written once, by site-prepare.
    Callers must not modify the arrays.
    """
    key = (store.url, dataset, job_id, split)
    if key not in _CACHE:
        while len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = load_split(store, dataset, job_id, split)
    return _CACHE[key]
