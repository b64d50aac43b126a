"""Asynchronous federation (``federation.mode: async``): the coordinator as a parameter server.

    algo = build_algorithm(training.federation.asynchronous)
    decision = algo.receive(server_state, newest_global, SiteUpdate(...))

One algorithm per file with its test beside it (``fedasync.py``, ``fedbuff.py``); :mod:`.server` is the
coordinator's loop over the exchange. Core: no Prefect here.
"""

from __future__ import annotations

from insitu.conf import AsyncConfig, TrainingConfig
from insitu.federated.asynchronous.base import AsyncAlgorithm, Decision, Entry, Receipt, ServerState, SiteUpdate
from insitu.federated.asynchronous.fedasync import FedAsync
from insitu.federated.asynchronous.fedbuff import FedBuff
from insitu.federated.kinds import async_update_limit
from insitu.plugins import named_subclasses

ALGORITHMS: dict[str, type[AsyncAlgorithm]] = named_subclasses(__name__, __path__, AsyncAlgorithm)

__all__ = ["ALGORITHMS", "AsyncAlgorithm", "Decision", "Entry", "FedAsync", "FedBuff", "Receipt", "ServerState",
           "SiteUpdate", "build_algorithm", "update_limit"]


def update_limit(training: TrainingConfig) -> int | None:
    """How many updates one site may push in this job: None in sync mode (one per round); in async mode enough for
    a site that alone made every version (the algorithm says how many updates one version takes)."""
    if training.federation.mode != "async":
        return None
    return async_update_limit(training.rounds, build_algorithm(training.federation.asynchronous).updates_per_version)


def build_algorithm(config: AsyncConfig) -> AsyncAlgorithm:
    """The configured algorithm (``config.algorithm``, one of :data:`ALGORITHMS`)."""
    cls = ALGORITHMS.get(config.algorithm)
    if cls is None:
        raise ValueError(f"unknown asynchronous algorithm {config.algorithm!r}; known: {sorted(ALGORITHMS)}")
    return cls(config)
