"""The parameter server's seam: one global model that moves on every time an update is applied.

In synchronous federation the coordinator waits for a round's updates and aggregates them together. Here sites
train continuously: each pulls the newest global *version*, trains, and pushes an update tagged with the
version it started from (its *base*). An :class:`AsyncAlgorithm` decides, update by update, what happens:

- its *staleness* is the current version minus its base; beyond ``max_staleness`` it is refused (the site
  is told to refresh: it pulls the newest version before it trains again anyway);
- otherwise it is applied at once (FedAsync) or buffered until ``buffer_size`` are in (FedBuff); every
  application makes version v + 1.

Everything the server must remember between updates is a :class:`ServerState`: the version, the buffered
updates' bookkeeping and the buffer's tensors, serialisable (JSON plus tensors) so that a resumed coordinator
continues exactly. The decision is pure: :meth:`AsyncAlgorithm.receive` returns a new state and never
mutates the one it is given; the exchange I/O is :mod:`insitu.federated.asynchronous.server`'s.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import torch

from insitu.conf import AsyncConfig
from insitu.federated.asynchronous.staleness import staleness_weight

State = dict[str, torch.Tensor]


@dataclass(frozen=True)
class SiteUpdate:
    """One site's pushed update: its trained weights and the global version (and weights) it trained from."""

    site: str
    seq: int  # the site's own count of the updates it pushed in this job, from 0
    base_version: int
    state: Mapping[str, torch.Tensor]
    base: Mapping[str, torch.Tensor]  # the global weights of ``base_version``
    n_samples: int


@dataclass(frozen=True)
class Entry:
    """What the server remembers of one accepted update (in the buffer, or in an applied version)."""

    site: str
    seq: int
    base_version: int
    staleness: int
    weight: float  # the weight it got: FedAsync's α_t, FedBuff's s(τ)

    def as_dict(self) -> dict[str, Any]:
        return {"site": self.site, "seq": self.seq, "base_version": self.base_version, "staleness": self.staleness,
                "weight": self.weight}


@dataclass(frozen=True)
class ServerState:
    """The parameter server between two updates: the newest version and the buffer (FedBuff's; empty for
    FedAsync). ``buffer_sum`` is Σ s(τ_i)·(w_i − w_base_i) over the buffered updates, in float64."""

    version: int = 0
    buffer: tuple[Entry, ...] = ()
    buffer_sum: Mapping[str, torch.Tensor] | None = None

    def to_json(self) -> dict[str, Any]:
        """Everything but the tensors (which go beside it as a model state)."""
        return {"version": self.version, "buffer": [e.as_dict() for e in self.buffer]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], buffer_sum: Mapping[str, torch.Tensor] | None = None) -> ServerState:
        buffer = tuple(Entry(**e) for e in doc.get("buffer", []))
        if buffer and buffer_sum is None:
            raise ValueError(f"a server state with {len(buffer)} buffered update(s) needs the buffer's tensors")
        return cls(int(doc["version"]), buffer, buffer_sum if buffer else None)


@dataclass(frozen=True)
class Receipt:
    """The server's decision on one update."""

    site: str
    seq: int
    base_version: int
    staleness: int
    accepted: bool
    version: int  # the newest version after the decision
    weight: float = 0.0
    applied: tuple[Entry, ...] = ()  # the updates that made the new version (empty: refused or buffered)
    reason: str = ""  # why it was refused

    @property
    def new_version(self) -> bool:
        return bool(self.applied)


@dataclass
class Decision:
    """:meth:`AsyncAlgorithm.receive`'s result: the server's next state, the new global weights if an
    application happened, and the receipt."""

    state: ServerState
    global_state: State | None
    receipt: Receipt
    extra: dict[str, Any] = field(default_factory=dict)


class AsyncAlgorithm(ABC):
    """Base of the asynchronous algorithms; subclasses set ``name`` and implement :meth:`_accept`."""

    name: ClassVar[str]

    def __init__(self, config: AsyncConfig) -> None:
        self.config = config

    @property
    def updates_per_version(self) -> int:
        """Accepted updates one new global version takes (FedAsync: every update is one; FedBuff: its buffer)."""
        return 1

    def receive(self, server: ServerState, global_state: Mapping[str, torch.Tensor], update: SiteUpdate) -> Decision:
        """Decide one update against the server's state and the newest global weights (those of
        ``server.version``).

        Raises
        ------
        ValueError
            When the update claims a base version newer than the server's (nobody published it), or does not
            match the global model's names and shapes.
        """
        staleness = server.version - update.base_version
        if staleness < 0:
            raise ValueError(f"update {update.seq} of {update.site!r} claims base version {update.base_version}; "
                             f"the newest is {server.version}")
        _check_layout(global_state, update)
        if staleness > self.config.max_staleness:
            reason = (f"staleness {staleness} (trained from version {update.base_version}, newest {server.version}) "
                      f"exceeds max_staleness {self.config.max_staleness}: refresh to version {server.version}")
            receipt = Receipt(update.site, update.seq, update.base_version, staleness, False, server.version,
                              reason=reason)
            return Decision(server, None, receipt)
        s = staleness_weight(self.config.staleness, staleness)
        return self._accept(server, global_state, update, staleness, s)

    @abstractmethod
    def _accept(self, server: ServerState, global_state: Mapping[str, torch.Tensor], update: SiteUpdate,
                staleness: int, s: float) -> Decision:
        """Apply or buffer an update within the staleness bound; ``s`` is s(staleness)."""


def _check_layout(global_state: Mapping[str, torch.Tensor], update: SiteUpdate) -> None:
    for name, st in (("update", update.state), ("base", update.base)):
        if list(st) != list(global_state):
            raise ValueError(f"the {name} of {update.site!r} (seq {update.seq}) has other parameters than the "
                             "global model")
        for k, ref in global_state.items():
            if st[k].shape != ref.shape:
                raise ValueError(f"the {name} of {update.site!r} (seq {update.seq}): {k!r} has shape "
                                 f"{tuple(st[k].shape)}, the global model's is {tuple(ref.shape)}")


def as_dtype_of(values: Mapping[str, torch.Tensor], global_state: Mapping[str, torch.Tensor]) -> State:
    """``values`` (float64 arithmetic) back in the global model's dtypes."""
    return {k: values[k].detach().to(ref.dtype) for k, ref in global_state.items()}


def with_state(server: ServerState, **changes: Any) -> ServerState:
    return replace(server, **changes)
