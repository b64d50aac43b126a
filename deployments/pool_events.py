"""Wake a worker when its pool gets a flow run, instead of having it ask the Prefect API every few seconds.

The Prefect server emits an event for every state a flow run enters (``prefect.flow-run.Scheduled``, ``Pending``,
…), naming the run's work pool among its related resources, and streams the events to any client that
subscribes over a websocket (``/api/events/out``). A worker that listens for its own pool's events learns of a
new run within a fraction of a second of its creation, and can leave its idle poll, the safety net for a missed
event, at a slow pace: the four idle workers' polls were a third of the idle platform's Prefect server CPU.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from uuid import UUID

if TYPE_CHECKING:
    from prefect.events.filters import EventFilter

log = logging.getLogger(__name__)

RETRY_S = 5.0  # after the stream failed, its next subscription


def pool_events(pool_id: UUID) -> EventFilter:
    """Flow-run events (any state: a run scheduled, pending, cancelling, …) that name the pool ``pool_id``, as
    Prefect's own worker filters the stream for its cancellations (``any_resource``: the stream applies it;
    its ``related`` filter is a database query only)."""
    from prefect.events.filters import EventAnyResourceFilter, EventFilter, EventNameFilter

    return EventFilter(event=EventNameFilter(prefix=["prefect.flow-run."]),
                       any_resource=EventAnyResourceFilter(id=[f"prefect.work-pool.{pool_id}"]))


def of_pool(event: Any, pool_id: UUID) -> bool:
    """Whether ``event`` names the work pool ``pool_id`` among its related resources (checked again on receipt:
    the stream is another process's filter)."""
    wanted = f"prefect.work-pool.{pool_id}"
    return any(r.id == wanted and r.role == "work-pool" for r in event.related)


async def wake_on_pool_events(pool_id: UUID, wake: Callable[[], None], retry_s: float = RETRY_S,
                              listening: Callable[[], None] | None = None) -> None:
    """Call ``wake()`` on each flow-run event of the pool ``pool_id``, until cancelled (``listening()`` each time
    the stream is subscribed).

    The stream is subscribed again after it failed (the server restarted, the connection dropped): meanwhile the
    worker's own idle poll still finds its runs, only later.
    """
    from prefect.events.clients import get_events_subscriber

    while True:
        try:
            async with get_events_subscriber(filter=pool_events(pool_id)) as events:
                log.info("listening for flow-run events of work pool %s", pool_id)
                if listening is not None:
                    listening()
                async for event in events:
                    if of_pool(event, pool_id):
                        log.debug("%s: %s", event.event, event.resource.id)
                        wake()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the stream is an accelerator: never the worker's end
            log.warning("flow-run event stream of work pool %s failed (%s: %s); subscribing again in %.0f s",
                        pool_id, type(e).__name__, e, retry_s)
        await asyncio.sleep(retry_s)
