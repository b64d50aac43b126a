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
