"""Shared helpers for the benchmarks: synthetic prepared data in a file:// store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from insitu.data.prepare import prepared_prefix


def write_prepared(root: Path, rows: int, features: int, shards: int = 2, dataset: str = "bench",
                   job: str = "bench") -> None:
    rng = np.random.default_rng(0)
    d = root / prepared_prefix(dataset, job) / "train"
    d.mkdir(parents=True, exist_ok=True)
    for i, part in enumerate(np.array_split(np.arange(rows), shards)):
        x = rng.normal(size=(len(part), features)).astype(np.float32)
        frame = pd.DataFrame(x, columns=[f"f{j}" for j in range(features)])
        frame["label"] = (x[:, 0] + 0.3 * rng.normal(size=len(part)) > 1.2).astype(np.float32)
        frame.to_parquet(d / f"shard-{i}.parquet", index=False)
