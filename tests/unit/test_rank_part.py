"""Each rank reads only its block of a prepared split: the row groups that overlap it, nothing else."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
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


def test_a_rank_reads_only_the_row_groups_of_its_block(tmp_path: Path) -> None:
    store, ids = _split(tmp_path, [250, 130, 321], row_group=50)  # 5 + 3 + 7 row groups
    world = 4
    per_rank = len(ids) // world  # 175
    for r in range(world):
        part = load_rank_part(store, "toy", "job", "train", r, world)
        # a block of 175 rows spans at most ceil(175 / 50) + 1 row groups (+1 per shard boundary inside it)
        assert len(part.row_groups_read) <= 6, part.row_groups_read
        assert part.first_row == r * per_rank
    # rank 0 never opens the last shard's data, the last rank never the first shard's
    assert {f for f, _ in load_rank_part(store, "toy", "job", "train", 0, world).row_groups_read} == {
        str(tmp_path / prepared_prefix("toy", "job") / "train" / "shard-000.parquet")}
    last = load_rank_part(store, "toy", "job", "train", world - 1, world).row_groups_read
    assert all("shard-000" not in f for f, _ in last)


def test_one_rank_reads_the_whole_split_like_load_split(tmp_path: Path) -> None:
    store, _ = _split(tmp_path, [40, 70], row_group=16)
    part = load_rank_part(store, "toy", "job", "train", 0, 1)
    x, y = load_split(store, "toy", "job", "train")
    assert np.array_equal(part.x, x) and np.array_equal(part.y, y)


def test_more_ranks_than_rows_is_a_clear_error(tmp_path: Path) -> None:
    store, _ = _split(tmp_path, [3], row_group=2)
    with pytest.raises(ValueError, match="3 rows, fewer than its 4 ranks"):
        load_rank_part(store, "toy", "job", "train", 0, 4)
    with pytest.raises(ValueError, match="rank 4 is not in a world of 4"):
        load_rank_part(store, "toy", "job", "train", 4, 4)
