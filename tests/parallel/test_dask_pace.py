"""A site's Dask scheduler with the platform's preload tells its workers to heartbeat every 2 s, not every 0.5 s."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import distributed.scheduler
import pytest
from distributed import Scheduler, Worker

PRELOAD = "deployments.platform.dask_pace"


@pytest.fixture
def dask_default() -> Iterator[None]:
    """The preload patches the scheduler module for its process: put Dask's own rule back for the other tests."""
    original = distributed.scheduler.heartbeat_interval
    yield
    distributed.scheduler.heartbeat_interval = original


async def _worker_heartbeat_ms(preload: list[str]) -> float:
    async with Scheduler(host="127.0.0.1", port=0, dashboard_address=":0", preload=preload) as s, \
            Worker(s.address, nthreads=1, dashboard_address=":0") as w:
        for _ in range(100):  # the worker adopts the scheduler's interval from its first heartbeat's answer
            if w.periodic_callbacks["heartbeat"].callback_time != 1000:
                break
            await asyncio.sleep(0.05)
        return w.periodic_callbacks["heartbeat"].callback_time


def test_the_preload_slows_the_heartbeats_of_a_small_cluster(dask_default: None) -> None:
    assert asyncio.run(_worker_heartbeat_ms([])) == 500  # Dask's rule for up to ten workers
    assert asyncio.run(_worker_heartbeat_ms([PRELOAD])) == 2000


def test_large_clusters_keep_dasks_longer_interval(dask_default: None) -> None:
    from deployments.platform import dask_pace

    assert dask_pace.heartbeat_interval(3) == dask_pace.HEARTBEAT_S
    assert dask_pace.heartbeat_interval(1000) == 6.0  # Dask's n / 200 + 1
