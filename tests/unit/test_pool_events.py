"""A worker hears of a flow run scheduled in its pool from the Prefect server's event stream (a real server,
Prefect's test harness), and only of its own pool's runs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.testing.utilities import prefect_test_harness

from deployments.pool_events import wake_on_pool_events


@pytest.fixture(scope="module")
def prefect_server() -> Iterator[None]:
    with prefect_test_harness(server_startup_timeout=120):
        yield


async def _scheduled_run(pool: str) -> None:
    async with get_client() as c:
        flow_id = await c.create_flow_from_name("site-prepare")
        dep = await c.create_deployment(flow_id, f"in-{pool}", work_pool_name=pool)
        await c.create_flow_run_from_deployment(dep)


def test_a_run_scheduled_in_the_pool_wakes_its_worker_and_another_pools_does_not(prefect_server: None) -> None:
    async def scenario() -> tuple[list[str], list[str]]:
        async with get_client() as c:
            ours = await c.create_work_pool(WorkPoolCreate(name="insitu-eu", type="process"))
            await c.create_work_pool(WorkPoolCreate(name="insitu-us", type="process"))
        woken: list[str] = []
        subscribed = asyncio.Event()
        listener = asyncio.create_task(wake_on_pool_events(ours.id, lambda: woken.append("eu"),
                                                           listening=subscribed.set))
        try:
            # the other pool's run is scheduled only once the stream is up: its silence means something
            await asyncio.wait_for(subscribed.wait(), 60)
            await _scheduled_run("insitu-us")
            await asyncio.sleep(5)
            before = list(woken)
            await _scheduled_run("insitu-eu")
            for _ in range(300):  # the event comes within a second or so; 30 s for a loaded machine
                if woken:
                    break
                await asyncio.sleep(0.1)
            return before, woken
        finally:
            listener.cancel()

    other_pool, ours = asyncio.run(scenario())
    assert other_pool == [], "a run scheduled in another pool woke this worker"
    assert ours, "a run scheduled in this worker's pool did not wake it"
