"""Run N ranks of a training function on a site's Dask workers, one rank per worker.

Rank 0's worker hosts the ``torch.distributed`` rendezvous (a free port found *on that worker*). Each
rank is pinned to its own worker (two ranks on one single-threaded worker would deadlock), sets
``OMP_NUM_THREADS``-equivalent to one thread on CPU, and always destroys its process group, on success
and on error. Backend: gloo on CPU, nccl when the workers have CUDA (one GPU per rank).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class LaunchError(RuntimeError):
    """The site's Dask cluster cannot host the requested ranks."""


class RankFailed(RuntimeError):
    """A rank failed or its worker died; the whole group is torn down (retry to resume)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def rank_entry(
    fn: Callable[[int, int, Any], T], rank: int, world: int, addr: str, port: int, payload: Any, timeout_s: float
) -> T:
    """Runs on a Dask worker: join the process group, run ``fn(rank, world, payload)``, leave cleanly."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    if cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    else:
        torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    try:
        result = fn(rank, world, payload)
        dist.barrier()
        return result
    finally:
        dist.destroy_process_group()


def launch_on_dask(
    address: str,
    fn: Callable[[int, int, Any], T],
    world: int,
    payload: Any,
    timeout_s: float = 600.0,
    key_prefix: str = "rank",
    worker_wait_s: float = 60.0,
    round_timeout_s: float | None = None,
) -> list[T]:
    """Run ``fn`` as ``world`` ranks on the cluster at ``address``; returns every rank's result."""
    from distributed import Client, Lock, as_completed

    # Lock() uses the Client just created (it becomes the default client).
    with Client(address, timeout=30) as client, Lock("insitu-ddp-launch"):
        # One process group at a time on a site's cluster: two jobs interleaving their ranks on
        # single-threaded workers would each hold a worker while waiting for a peer (deadlock).
        try:  # a worker that just died is being restarted by its nanny: give it a moment
            client.wait_for_workers(world, timeout=worker_wait_s)
        except TimeoutError:
            pass
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
        if len(workers) < world:
            raise LaunchError(
                f"{world} ranks need {world} Dask workers but the site's scheduler at {address} has "
                f"{len(workers)}: {workers}. Start more workers or lower ranks_per_site."
            )
        chosen = workers[:world]
        port = client.run(_free_port, workers=[chosen[0]])[chosen[0]]
        host = chosen[0].split("://", 1)[-1].rsplit(":", 1)[0]
        log.info("launching %d ranks on %s; rendezvous tcp://%s:%d", world, chosen, host, port)
        futures = [
            client.submit(rank_entry, fn, rank, world, host, port, payload, timeout_s, workers=[w],
                          allow_other_workers=False, pure=False, key=f"{key_prefix}-{rank}-{port}")
            for rank, w in enumerate(chosen)
        ]
        # A rank pinned to a worker that dies would wait forever for that worker to return; the other
        # ranks fail in their next collective. Stop at the first failure and cancel the rest.
        try:
            # No overall deadline: a long round is fine; a stuck collective fails after timeout_s.
            for fut in as_completed(futures, timeout=round_timeout_s):
                if fut.status == "error":
                    first = fut.exception()
                    client.cancel(futures)
                    raise RankFailed(f"a rank failed on {address} ({first!r}); the group was torn down, the "
                                     "round can be retried and resumes from its last checkpoint") from first
        except TimeoutError as e:
            client.cancel(futures)
            raise RankFailed(f"ranks on {address} still running after {round_timeout_s:.0f}s") from e
        return client.gather(futures)
