"""Dask prepare (one task per shard on a 2-worker cluster) vs single-process pandas doing the same work.

    .venv/bin/python bench/prep_throughput.py --rows 50000 --shards 4 --scales 1,10

Both call the same ``prepare_shard`` on the same files (validate, quarantine, featurize, split, write);
the baseline runs it shard after shard in this process. Prints rows/s for each, their ratio, and how
time grows from 1x to Nx rows.
"""

from __future__ import annotations

import argparse
import importlib
import json
import tempfile
import time
from pathlib import Path

from distributed import Client, LocalCluster

from insitu.conf import load_conf
from insitu.data.prepare import prepare_shard
from insitu.data.synthetic import generate, inject_malformed
from insitu.storage import Store

REPO = Path(__file__).resolve().parent.parent


def make_shards(root: Path, rows: int, shards: int) -> list:
    conf = load_conf("fraud", directory=REPO / "conf")
    base = conf.dataset.shards_of("eu")[0]
    out = []
    for i in range(shards):
        shard = base.model_copy(update={"id": f"eu-b{i:03d}", "path": f"raw/bench/part-{i:03d}.parquet"})
        (root / "raw/bench").mkdir(parents=True, exist_ok=True)
        df, _ = inject_malformed(generate("eu", rows // shards, seed=1, shard=i), 0.005, i)
        df.to_parquet(root / shard.path, index=False)
        out.append(shard)
    return conf, out


def run(rows: int, shards: int, client: Client) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="insitu-prep-"))
    conf, shard_list = make_shards(root, rows, shards)
    store = Store(f"file://{root}/", {})
    t = conf.training
    args = (conf.dataset.schema_, t.split, conf.dataset.split_key, "fraud")
    t0 = time.perf_counter()
    for s in shard_list:
        prepare_shard(store, s, *args, "pandas")
    pandas_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    futures = [client.submit(prepare_shard, store, s, *args, "dask", pure=False) for s in shard_list]
    reports = client.gather(futures)
    dask_s = time.perf_counter() - t0
    assert sum(r.rows_read for r in reports) == rows // shards * shards
    return {"rows": rows, "pandas_rows_per_s": rows / pandas_s, "dask_rows_per_s": rows / dask_s,
            "ratio": pandas_s / dask_s, "pandas_s": pandas_s, "dask_s": dask_s}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--scales", default="1,10")
    args = ap.parse_args()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      host="127.0.0.1") as cluster, Client(cluster) as client:
        # Import the prepare code on the workers before timing, as it already is in this process.
        client.run(importlib.import_module, "insitu.data.prepare")
        results = [run(args.rows * int(k), args.shards, client) for k in args.scales.split(",")]
    base = results[0]
    for r in results:
        r["time_growth_dask"] = r["dask_s"] / base["dask_s"]
        r["time_growth_pandas"] = r["pandas_s"] / base["pandas_s"]
    print(json.dumps([{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in results]))


if __name__ == "__main__":
    main()
