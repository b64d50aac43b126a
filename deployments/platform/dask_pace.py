"""Loaded into each site's Dask scheduler (``dask scheduler --preload deployments.platform.dask_pace``): its workers
and clients heartbeat every :data:`HEARTBEAT_S` instead of twice a second.

The scheduler tells each worker how often to heartbeat (``distributed.scheduler.heartbeat_interval``): every 0.5 s
in a cluster of up to ten workers, with no setting to change it. Each heartbeat is a TLS round trip that collects
the worker's metrics (psutil) on one side and updates the scheduler's state on the other; for a site's two workers
that was most of its idle Dask CPU. insitu's scheduling does not use what a heartbeat carries (tasks are placed by
the site's flow, one rank per worker); a lost worker is noticed when its connection closes, and the scheduler's
time-to-live for a silent worker (``distributed.scheduler.worker-ttl``, five minutes) is unchanged.
"""

from __future__ import annotations

import distributed.scheduler

HEARTBEAT_S = 2.0
_DASK_DEFAULT = distributed.scheduler.heartbeat_interval


def heartbeat_interval(n: int) -> float:
    """Dask's interval for ``n`` workers (or clients), but never shorter than :data:`HEARTBEAT_S`."""
    return max(HEARTBEAT_S, _DASK_DEFAULT(n))


distributed.scheduler.heartbeat_interval = heartbeat_interval
