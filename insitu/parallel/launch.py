"""Run N ranks of a training function on a site's Dask workers, one rank per worker.

The ranks meet in a ``torch.distributed.FileStore`` in a fresh directory of mode 0700 that rank 0's worker
makes (``insitu.parallel.rendezvous``): no TCP store, so no other local user can reach it. Every chosen worker
must see that directory (one host, or a shared ``INSITU_RENDEZVOUS_DIR``), else the launch is refused. Each
rank is pinned to its own worker (two ranks on one single-threaded worker would deadlock), sets
``OMP_NUM_THREADS``-equivalent to one thread on CPU, and always destroys its process group, on success
and on error, then collects what the rank left in reference cycles (:func:`_collect_rank_garbage`).
Backend: gloo on CPU, nccl when the workers have CUDA (one GPU per rank).
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from insitu.parallel.rendezvous import (
    RENDEZVOUS_DIR_ENV,
    init_method,
    make_rendezvous,
    remove_rendezvous,
    sees_rendezvous,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


class LaunchError(RuntimeError):
    """The site's Dask cluster cannot host the requested ranks."""


class RankFailed(RuntimeError):
    """A rank failed or its worker died; the whole group is torn down (retry to resume)."""


def rank_entry(
    fn: Callable[[int, int, Any], T], rank: int, world: int, init_method: str, payload: Any, timeout_s: float
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
    gc.freeze()  # what the worker held before this rank: the collection after it need not scan that again
    try:
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        try:
            result = fn(rank, world, payload)
            dist.barrier()
            return result
        finally:
            dist.destroy_process_group()
    finally:
        _collect_rank_garbage()


def _collect_rank_garbage() -> None:
    """Free what a finished rank left in reference cycles, at once.

    A destroyed process group is still held by reference cycles among what the rank built until Python's
    collector visits them, which an idle worker's few allocations never trigger: each left its gloo transport's
    thread running, more with every round (4 to 6 per worker after two demo jobs, most of an idle site's Dask
    CPU after a job). A full collection of a worker that imported torch takes about 0.3 s; of only what the rank made
    (everything older frozen at its start) about 20 ms. Unfrozen again after, so nothing stays exempt.
    """
    try:
        gc.collect()
    finally:
        gc.unfreeze()


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
    from distributed import Client, Lock

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
        directory, token = client.run(make_rendezvous, workers=[chosen[0]])[chosen[0]]
        try:
            return _run_ranks(client, address, fn, world, payload, timeout_s, key_prefix, round_timeout_s,
                              chosen, directory, token)
        finally:
            # A worker that died took nothing of the group with it but this folder: never mask the real error.
            client.run(remove_rendezvous, directory, workers=[chosen[0]], on_error="ignore")


def _run_ranks(client: Any, address: str, fn: Callable[[int, int, Any], T], world: int, payload: Any,
               timeout_s: float, key_prefix: str, round_timeout_s: float | None, chosen: list[str],
               directory: str, token: str) -> list[T]:
    from distributed import as_completed

    seen = client.run(sees_rendezvous, directory, token, workers=chosen)
    blind = [w for w in chosen if not seen.get(w)]
    if blind:
        raise LaunchError(
            f"workers {blind} of {address} cannot see rank 0's private rendezvous directory {directory} (on "
            f"{chosen[0]}): their ranks could only meet over an unauthenticated TCP store, which insitu refuses. "
            f"Run a site's ranks on one host, or set {RENDEZVOUS_DIR_ENV} on every worker to a directory on a "
            "filesystem they share, owned by the site's user with mode 0700.")
    url = init_method(directory)
    log.info("launching %d ranks on %s; rendezvous %s", world, chosen, url)
    futures = [
        client.submit(rank_entry, fn, rank, world, url, payload, timeout_s, workers=[w],
                      allow_other_workers=False, pure=False, key=f"{key_prefix}-{rank}-{token[:8]}")
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
