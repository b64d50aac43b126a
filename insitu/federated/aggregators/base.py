"""The aggregator seam: what sites train with each round, and how their updates become the next global model.

Like Flower's ``Strategy``, an aggregator has a configure hook (the settings sent to sites for a round) and an
aggregate hook. Unlike it, an aggregator object holds no state between rounds: whatever it must remember (the
moments of a server optimiser) is returned as plain tensors, stored on the exchange by the coordinator and handed
back on the next call, so that a resumed job continues exactly where it stopped.

This module is core: it imports neither Prefect nor the exchange, only torch, pydantic and the state checks.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from insitu.federated.states import delta_norm

State = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Update:
    """One site's trained model state for a round and the number of samples it trained on."""

    site: str
    state: State
    n_samples: int


class Aggregator(ABC):
    """Base of every aggregator; subclasses set ``name``, may extend ``Options`` and implement ``_aggregate``.

    The base checks the updates (names, shapes, dtypes, finite values, sample counts, optional norm bound),
    passes integer tensors through from the update with the most samples, and casts the result to the global
    model's dtypes, so a subclass only combines floating-point tensors.
    """

    name: ClassVar[str]
    # Whether federation.mode async may use it: there the server step is the async algorithm's, so only an
    # aggregator whose part is what sites train with (FedAvg's plain step, FedProx's proximal term) fits.
    runs_in_async_mode: ClassVar[bool] = False
    # Whether the result depends on the updates only through their sample-weighted mean (and the largest site's
    # integer tensors): then the coordinator folds each update into a running mean as it reads it
    # (insitu.federated.running_mean) and aggregates that one mean, holding one update at a time, not all.
    mean_based: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # Not inherited: a subclass of FedAvg that weighs or clips each update must not silently get one mean.
        cls.mean_based = bool(cls.__dict__.get("mean_based", False))

    class Options(BaseModel):
        """The aggregator's own options (``aggregator.options`` in a training config); none by default."""

        # Frozen: one options object may be shared by rounds and must not drift. No NaN/inf: they would only
        # surface as a diverged model rounds later. Strict: `mu: "0.1"` or `mu: yes` in YAML is a mistake to
        # report, not a value to coerce (ints are still accepted for floats).
        model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    def __init__(self, options: Options | None = None, *, max_update_norm: float | None = None) -> None:
        if options is None:
            options = self.Options()
        if type(options) is not self.Options:  # another aggregator's options would be silently misread
            raise TypeError(f"{type(self).__name__} takes {type(self).__name__}.Options, "
                            f"not {type(options).__qualname__}")
        if max_update_norm is not None and not (math.isfinite(max_update_norm) and max_update_norm > 0):
            raise ValueError(f"max_update_norm must be a positive finite number or None, got {max_update_norm!r}")
        self.options = options
        self.max_update_norm = max_update_norm

    @classmethod
    def site_gradient_hook(cls, params: list[tuple[str, nn.Parameter]], reference: Mapping[str, torch.Tensor],
                           site_options: Mapping[str, float]) -> Callable[[], None] | None:
        """The aggregator's part in a site's training: called after each step's backward, before the optimizer
        step, on the parameters a rank holds (whole model, FSDP shard or pipeline stage, by the unwrapped model's
        names), with the round's global state as ``reference`` and :meth:`configure`'s ``site_options``. None
        (the default): plain local training."""
        return None

    def configure(self, rnd: int) -> dict[str, float]:
        """What sites train with in round ``rnd`` (e.g. a proximal coefficient); nothing by default."""
        return {}

    def aggregate(
        self,
        rnd: int,
        global_state: Mapping[str, torch.Tensor],
        updates: list[Update],
        server_state: Mapping[str, torch.Tensor] | None = None,
    ) -> tuple[State, State | None]:
        """The next global state and the state to keep for the next round (None when stateless).

        Raises
        ------
        ValueError
            When there are no updates, an update does not match the global model (names, shapes, dtypes),
            holds a non-finite value, has a bad sample count, or moved further than ``max_update_norm``.
        """
        self.check(global_state, updates)
        combined, kept = self._aggregate(rnd, global_state, updates, server_state)
        largest = max(updates, key=lambda u: u.n_samples)  # the first of equals, as in fedavg
        out: State = {}
        for k, ref in global_state.items():
            if ref.is_floating_point():
                out[k] = combined[k].detach().to(ref.dtype)
            else:
                # Counters (num_batches_tracked) have no meaningful mean: take the most representative site's.
                out[k] = largest.state[k].detach().clone()
        return out, kept

    @abstractmethod
    def _aggregate(
        self,
        rnd: int,
        global_state: Mapping[str, torch.Tensor],
        updates: list[Update],
        server_state: Mapping[str, torch.Tensor] | None,
    ) -> tuple[Mapping[str, torch.Tensor], State | None]:
        """Combine the checked updates: every floating-point tensor of the global state, plus the state to keep."""

    def check(self, global_state: Mapping[str, torch.Tensor], updates: list[Update]) -> None:
        """Raise ValueError unless every update fits the global model; the exchange checks this too, this is
        defence in depth for callers that did not go through it (and for the bench)."""
        if not updates:
            raise ValueError(f"{self.name}: at least one update is needed to aggregate")
        keys = list(global_state)
        for k, ref in global_state.items():
            if ref.is_floating_point() and not bool(torch.isfinite(ref).all()):
                raise ValueError(f"{self.name}: the global state's {k!r} holds NaN or infinite values")
        for u in updates:
            if isinstance(u.n_samples, bool) or not isinstance(u.n_samples, int) or u.n_samples < 0:
                raise ValueError(f"{self.name}: update from site {u.site!r} has sample count {u.n_samples!r}; "
                                 "it must be a non-negative integer")
            if list(u.state) != keys:
                extra = [k for k in u.state if k not in global_state]
                missing = [k for k in keys if k not in u.state]
                raise ValueError(f"{self.name}: update from site {u.site!r} has different parameter names than "
                                 f"the global model: extra {extra}, missing {missing}")
            for k, ref in global_state.items():
                v = u.state[k]
                if v.shape != ref.shape:
                    raise ValueError(f"{self.name}: update from site {u.site!r}: {k!r} has shape {tuple(v.shape)}; "
                                     f"the global model's is {tuple(ref.shape)}")
                if v.dtype != ref.dtype:
                    raise ValueError(f"{self.name}: update from site {u.site!r}: {k!r} has dtype {v.dtype}; "
                                     f"the global model's is {ref.dtype}")
                if v.is_floating_point() and not bool(torch.isfinite(v).all()):
                    raise ValueError(f"{self.name}: update from site {u.site!r}: {k!r} holds NaN or infinite values")
            if self.max_update_norm is not None:
                norm = delta_norm(u.state, global_state)
                if norm > self.max_update_norm:
                    raise ValueError(f"{self.name}: update from site {u.site!r}: ||update - global||_2 = {norm:.4g} "
                                     f"exceeds max_update_norm {self.max_update_norm:g}")
        if sum(u.n_samples for u in updates) <= 0:
            raise ValueError(f"{self.name}: the updates' sample counts sum to 0; at least one site must have trained")


def floating(global_state: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of the tensors an aggregator combines (the rest pass through)."""
    return [k for k, v in global_state.items() if v.is_floating_point()]


def stacked(updates: list[Update], key: str) -> torch.Tensor:
    """``(n_updates, *shape)`` float64 stack of one tensor across updates, for coordinate-wise statistics."""
    return torch.stack([u.state[key].detach().to(torch.float64) for u in updates])
