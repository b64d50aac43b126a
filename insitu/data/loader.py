"""Read a site's prepared split: whole (evaluation) or one rank's part of it (distributed training).

A rank's part is a contiguous block of the split, in shard order, found from the Parquet footers: the
rank reads only the row groups that overlap its block, so beyond its own rows it reads at most the rest
of the (8,192-row) groups at its block's two ends. Blocks have equal sizes; the split's last
``rows % world`` rows are left out (as ``drop_last=True`` does in ``DistributedSampler``, whose rows are
interleaved rather than contiguous). Files are opened without read-ahead (``cache_type="none"``): s3fs
would otherwise fetch many MiB past each requested range.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from insitu.data.prepare import prepared_prefix
from insitu.storage import Store


def split_files(store: Store, dataset: str, job_id: str, split: str) -> list[str]:
    """The split's Parquet files (filesystem paths, shard order); a clear error when there are none."""
    prefix = store.path(f"{prepared_prefix(dataset, job_id)}/{split}")
    fs = store.fs
    fs.invalidate_cache(prefix)
    files = sorted(fs.glob(prefix + "/*.parquet")) if fs.exists(prefix) else []
    if not files:
        raise FileNotFoundError(f"no prepared {split} data at {store.full_url(prepared_prefix(dataset, job_id))}")
    return files


def _arrays(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    df = table.to_pandas()
    y = df.pop("label").to_numpy(dtype=np.float32)
    return df.to_numpy(dtype=np.float32), y


def load_split(store: Store, dataset: str, job_id: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` for one split of the site's prepared data (all shards, in shard order).

    The one rank of a world of one: the same reader, column check and column order as training's ranks.
    """
    part = load_rank_part(store, dataset, job_id, split, 0, 1)
    return part.x, part.y


@dataclass
class RankPart:
    """One rank's rows, and what it took to read them."""

    x: np.ndarray
    y: np.ndarray
    split_rows: int  # rows in the whole split (all ranks)
    first_row: int  # this part is rows [first_row, first_row + len(y)) of the split
    row_groups_read: list[tuple[str, int]]  # (file, row group) actually read


def load_rank_part(store: Store, dataset: str, job_id: str, split: str, rank: int, world: int) -> RankPart:
    """Rank ``rank`` of ``world``'s block of the split: ``split_rows // world`` rows, read by row group.

    Every rank has the same number of rows (DDP needs equal step counts); the last ``split_rows % world``
    rows are left out, as ``DistributedSampler(drop_last=True)`` does.
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of {world}")
    fs = store.fs
    layout: list[tuple[str, int, int, int]] = []  # (file, row group, first row, rows)
    total = 0
    columns: list[str] = []
    for path in split_files(store, dataset, job_id, split):
        with fs.open(path, "rb", cache_type="none") as f:
            meta = pq.ParquetFile(f).metadata
        names = list(meta.schema.names)
        if not columns:
            columns = names
        elif sorted(names) != sorted(columns):
            raise ValueError(f"prepared file {path} has columns {names}, other files of the split have {columns}: "
                             "the split mixes preparations; re-run site-prepare for this job")
        for g in range(meta.num_row_groups):
            n = meta.row_group(g).num_rows
            layout.append((path, g, total, n))
            total += n
    per_rank = total // world
    if per_rank == 0:
        raise ValueError(f"the prepared {split} split of {dataset}/{job_id} has {total} rows, fewer than its "
                         f"{world} ranks: lower ranks_per_site or prepare more data")
    lo, hi = rank * per_rank, (rank + 1) * per_rank
    wanted = [(p, g, start, n) for p, g, start, n in layout if start < hi and start + n > lo and n > 0]
    tables: list[pa.Table] = []
    first = wanted[0][2]
    for path in dict.fromkeys(p for p, *_ in wanted):
        groups = [g for p, g, *_ in wanted if p == path]
        with fs.open(path, "rb", cache_type="none") as f:
            # select(): every rank sees the columns in one order, whatever order a file stores them in
            tables.append(pq.ParquetFile(f).read_row_groups(groups, columns=columns).select(columns))
    x, y = _arrays(pa.concat_tables(tables))
    # Copies: Arrow hands out read-only views, and the part is kept (cached) for the job's later rounds.
    x, y = x[lo - first : hi - first].copy(), y[lo - first : hi - first].copy()
    return RankPart(x, y, total, lo, [(p, g) for p, g, *_ in wanted])


_CACHE: dict[tuple[str, str, str, str, int, int], RankPart] = {}
_CACHE_SIZE = 4


def load_rank_part_cached(store: Store, dataset: str, job_id: str, split: str, rank: int, world: int) -> RankPart:
    """:func:`load_rank_part`, kept in this process for later rounds of the same job.

    A site's Dask workers live across rounds, so each rank reads its block of the job's prepared split
    once instead of once per round. Prepared data of a job is written once, by site-prepare. Callers
    must not modify the arrays.
    """
    key = (store.url, dataset, job_id, split, rank, world)
    if key not in _CACHE:
        while len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = store.ride_out(load_rank_part, store, dataset, job_id, split, rank, world,
                                     what=f"reading rank {rank}'s part of the prepared {split} split")
    return _CACHE[key]
