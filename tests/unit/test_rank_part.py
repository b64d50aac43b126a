"""Each rank reads only its block of a prepared split: the row groups that overlap it, nothing else."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from insitu.data.loader import load_rank_part, load_split
from insitu.data.prepare import prepared_prefix
from insitu.storage import Store

F = 3


def _split(tmp_path: Path, sizes: list[int], row_group: int) -> tuple[Store, np.ndarray]:
    """Shards of the given sizes, written with small row groups; returns the store and all labels-as-ids."""
    d = tmp_path / prepared_prefix("toy", "job") / "train"
    d.mkdir(parents=True)
    start = 0
    for i, n in enumerate(sizes):
        ids = np.arange(start, start + n, dtype=np.float32)
        frame = pd.DataFrame({f"f{j}": ids * (j + 1) for j in range(F)})
        frame["label"] = ids  # the row's global position, so the test can see which rows a rank got
        frame.to_parquet(d / f"shard-{i:03d}.parquet", index=False, row_group_size=row_group)
        start += n
    return Store(f"file://{tmp_path}/", {}), np.arange(start, dtype=np.float32)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_rank_parts_are_disjoint_equal_blocks_that_cover_the_split(tmp_path: Path, world: int) -> None:
    store, ids = _split(tmp_path, [250, 130, 321], row_group=50)
    parts = [load_rank_part(store, "toy", "job", "train", r, world) for r in range(world)]
    per_rank = len(ids) // world
    assert all(len(p.y) == per_rank and p.x.shape == (per_rank, F) for p in parts)
    assert np.array_equal(np.concatenate([p.y for p in parts]), ids[: per_rank * world])
    assert all(p.split_rows == len(ids) for p in parts)
    for p in parts:  # features travel with their labels
        assert np.array_equal(p.x[:, 1], p.y * 2)


def test_a_rank_reads_only_the_row_groups_of_its_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, ids = _split(tmp_path, [250, 130, 321], row_group=50)  # 5 + 3 + 7 row groups
    read: list[tuple[int, tuple[int, ...]]] = []  # (rows in the file, groups) of every read that happened
    real = pq.ParquetFile.read_row_groups

    def recording(self: pq.ParquetFile, row_groups: list[int], *a: object, **k: object) -> object:
        read.append((self.metadata.num_rows, tuple(row_groups)))
        return real(self, row_groups, *a, **k)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", recording)
    world = 4  # blocks of 175 rows: [0,175) [175,350) [350,525) [525,700)
    expected = [
        [(250, (0, 1, 2, 3))],                    # rows 0-199 of shard 0
        [(250, (3, 4)), (130, (0, 1))],           # 150-249 of shard 0, 250-349 of shard 1
        [(130, (2,)), (321, (0, 1, 2))],          # 350-379 of shard 1, 380-529 of shard 2
        [(321, (2, 3, 4, 5, 6))],                 # 480-700 of shard 2
    ]
    for r in range(world):
        read.clear()
        part = load_rank_part(store, "toy", "job", "train", r, world)
        assert read == expected[r], (r, read)
        assert part.first_row == r * (len(ids) // world)


def test_column_order_is_the_same_on_every_rank_whatever_a_file_stores(tmp_path: Path) -> None:
    store, ids = _split(tmp_path, [100, 100], row_group=30)
    second = tmp_path / prepared_prefix("toy", "job") / "train" / "shard-001.parquet"
    frame = pd.read_parquet(second)
    frame[["label", "f2", "f0", "f1"]].to_parquet(second, index=False, row_group_size=30)  # same data, reordered
    for r in range(2):
        part = load_rank_part(store, "toy", "job", "train", r, 2)
        assert np.array_equal(part.x[:, 1], part.y * 2) and np.array_equal(part.x[:, 2], part.y * 3)


def test_an_empty_shard_file_is_skipped(tmp_path: Path) -> None:
    store, ids = _split(tmp_path, [60, 0, 41], row_group=16)
    parts = [load_rank_part(store, "toy", "job", "train", r, 3) for r in range(3)]
    assert np.array_equal(np.concatenate([p.y for p in parts]), ids[:99])


def test_files_of_different_preparations_are_refused(tmp_path: Path) -> None:
    store, _ = _split(tmp_path, [40, 40], row_group=16)
    second = tmp_path / prepared_prefix("toy", "job") / "train" / "shard-001.parquet"
    pd.read_parquet(second).drop(columns=["f2"]).to_parquet(second, index=False)
    with pytest.raises(ValueError, match="mixes preparations"):
        load_rank_part(store, "toy", "job", "train", 0, 2)


def test_load_split_is_every_row_in_shard_order(tmp_path: Path) -> None:
    store, _ = _split(tmp_path, [40, 70], row_group=16)
    x, y = load_split(store, "toy", "job", "train")
    files = sorted((tmp_path / prepared_prefix("toy", "job") / "train").glob("*.parquet"))
    expected = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)  # an independent reader
    assert np.array_equal(y, expected.pop("label").to_numpy(np.float32))
    assert np.array_equal(x, expected.to_numpy(np.float32))


def test_more_ranks_than_rows_is_a_clear_error(tmp_path: Path) -> None:
    store, _ = _split(tmp_path, [3], row_group=2)
    with pytest.raises(ValueError, match="3 rows, fewer than its 4 ranks"):
        load_rank_part(store, "toy", "job", "train", 0, 4)
    with pytest.raises(ValueError, match="rank 4 is not in a world of 4"):
        load_rank_part(store, "toy", "job", "train", 4, 4)
