"""Server-side adaptive optimisers (Reddi et al., 2021, "Adaptive Federated Optimization", Algorithm 2).

The sites' FedAvg minus the global model is a pseudo-gradient ``delta``; the server takes one optimiser step
along it with first moment ``m`` and second moment ``v``:

    m = beta_1 * m + (1 - beta_1) * delta
    v = <the subclass's rule>                     (Adagrad, Yogi or Adam)
    x = x + eta * m / (sqrt(v) + tau)

FedAdam and FedYogi add the decay ``beta_2`` of ``v`` to the options; FedAdagrad, whose ``v`` never decays,
has none. ``m``, ``v`` (both starting at zero, as in Flower) and the number of steps taken are the aggregator's state:
returned after every round as ``{"m.<param>", "v.<param>", "step"}`` so that the coordinator can store it on the
exchange next to the global weights and hand it back when the job resumes. Moments are kept in each
parameter's own dtype (so the state is the model's size twice over); the arithmetic runs in float64.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Annotated

import torch
from pydantic import Field

from insitu.federated.aggregators.base import Aggregator, State, Update, floating
from insitu.federated.aggregators.fedavg import fedavg

STEP = "step"


class FedOpt(Aggregator):
    """Shared base of FedAdagrad, FedYogi and FedAdam; a subclass gives only its second-moment rule."""

    mean_based = True  # its pseudo-gradient is the sites' FedAvg minus the global model

    class Options(Aggregator.Options):
        eta: Annotated[float, Field(gt=0.0)] = 0.01  # server learning rate
        beta_1: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.9
        tau: Annotated[float, Field(gt=0.0)] = 1e-3  # adaptivity: keeps the step finite where v is ~0

    options: Options

    @abstractmethod
    def second_moment(self, v: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """The new ``v`` from the previous one and this round's pseudo-gradient (float64 tensors)."""

    def step_size(self, step: int) -> float:
        """``eta`` for server step ``step`` (1-based); FedAdam corrects it for the moments' zero start."""
        return self.options.eta

    def _aggregate(
        self,
        rnd: int,
        global_state: Mapping[str, torch.Tensor],
        updates: list[Update],
        server_state: Mapping[str, torch.Tensor] | None,
    ) -> tuple[State, State]:
        keys = floating(global_state)
        self._check_server_state(global_state, keys, server_state)
        avg = fedavg([(u.state, u.n_samples) for u in updates])
        step = 1 + (int(server_state[STEP]) if server_state is not None else 0)
        eta = self.step_size(step)
        b1 = self.options.beta_1
        out: State = {}
        kept: State = {}
        for k in keys:
            x = global_state[k].detach().to(torch.float64)
            delta = avg[k].to(torch.float64) - x
            if server_state is None:
                m_prev, v_prev = torch.zeros_like(x), torch.zeros_like(x)
            else:
                m_prev, v_prev = server_state[f"m.{k}"].to(torch.float64), server_state[f"v.{k}"].to(torch.float64)
            m = b1 * m_prev + (1 - b1) * delta
            # Rounding (Yogi's subtraction) must never hand sqrt a negative number.
            v = self.second_moment(v_prev, delta).clamp_min(0.0)
            out[k] = x + eta * m / (v.sqrt() + self.options.tau)
            kept[f"m.{k}"] = m.to(global_state[k].dtype)
            kept[f"v.{k}"] = v.to(global_state[k].dtype)
        kept[STEP] = torch.tensor(step, dtype=torch.int64)
        return out, kept

    def _check_server_state(
        self, global_state: Mapping[str, torch.Tensor], keys: list[str], server_state: Mapping[str, torch.Tensor] | None
    ) -> None:
        """A stored state from another model (or another aggregator) must not be mixed into this one."""
        if server_state is None:
            return
        expected = {STEP, *(f"m.{k}" for k in keys), *(f"v.{k}" for k in keys)}
        if set(server_state) != expected:
            extra = sorted(set(server_state) - expected)
            missing = sorted(expected - set(server_state))
            raise ValueError(f"{self.name}: the server state does not belong to this model: "
                             f"extra {extra}, missing {missing}")
        step = server_state[STEP]
        if step.is_floating_point() or step.numel() != 1 or int(step) < 0:
            raise ValueError(f"{self.name}: the server state's step must be one non-negative integer, got {step}")
        for k in keys:
            for name in (f"m.{k}", f"v.{k}"):
                t = server_state[name]
                if t.shape != global_state[k].shape:
                    raise ValueError(f"{self.name}: server state {name!r} has shape {tuple(t.shape)}; "
                                     f"the parameter's is {tuple(global_state[k].shape)}")
                if not bool(torch.isfinite(t).all()):
                    raise ValueError(f"{self.name}: server state {name!r} holds NaN or infinite values")
            if bool((server_state[f"v.{k}"] < 0).any()):
                raise ValueError(f"{self.name}: server state 'v.{k}' is negative; a second moment cannot be")
