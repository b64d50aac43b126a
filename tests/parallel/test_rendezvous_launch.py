"""The launcher's rendezvous on a real Dask cluster: a private folder made and removed around the group, and a
refusal (no TCP fallback) when a worker cannot see it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from distributed import Client
from toy_site import local_cluster

from insitu.parallel.launch import LaunchError, _run_ranks, launch_on_dask


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    with local_cluster(2) as address:
        yield address


def _store_of(rank: int, world: int, payload: None) -> str:
    import torch.distributed as dist

    dist.barrier()
    store = dist.distributed_c10d._get_default_store()
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return type(store).__name__


def _set_base(path: str | None) -> None:
    if path is None:
        os.environ.pop("INSITU_RENDEZVOUS_DIR", None)
    else:
        os.environ["INSITU_RENDEZVOUS_DIR"] = path


def test_ranks_meet_in_a_file_store_that_is_removed_afterwards(cluster: str, tmp_path: Path) -> None:
    with Client(cluster) as c:
        c.run(_set_base, str(tmp_path))
        try:
            stores = launch_on_dask(cluster, _store_of, 2, None, timeout_s=60)
        finally:
            c.run(_set_base, None)
    assert stores == ["FileStore", "FileStore"]
    assert list(tmp_path.iterdir()) == []  # the private folder is gone


def test_workers_that_cannot_see_the_folder_are_refused_with_the_fix(cluster: str) -> None:
    with Client(cluster) as c:
        workers = sorted(c.scheduler_info(n_workers=-1)["workers"])
        with pytest.raises(LaunchError, match="cannot see rank 0's private rendezvous.*INSITU_RENDEZVOUS_DIR"):
            _run_ranks(c, cluster, _store_of, 2, None, 60, "rank", None, workers, "/nonexistent/insitu-rdzv-x",
                       "0" * 32)
