"""FedProx (Li et al., 2020): FedAvg on the server, a proximal term in every site's local loss.

The term ``mu/2 * ||w - w_global||^2`` keeps each site's weights near the round's global model, which limits
client drift when the sites' data differ (non-IID). The server side is plain FedAvg; what changes is what sites
are told to train with (``configure``) and the loss they add (:func:`proximal_term`), or, equivalently and for
any in-site strategy (a sharded or pipelined model), its gradient (:class:`ProximalGradient`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Annotated

import torch
from pydantic import Field
from torch import nn

from insitu.federated.aggregators.base import Aggregator
from insitu.federated.aggregators.fedavg import FedAvg


class FedProx(FedAvg):
    """FedAvg whose rounds ask the sites for a proximal term of weight ``mu``."""

    name = "fedprox"
    mean_based = True  # its server step sees the sites only through their weighted mean

    class Options(Aggregator.Options):
        mu: Annotated[float, Field(ge=0.0)] = 0.01

    options: Options

    def configure(self, rnd: int) -> dict[str, float]:
        return {"proximal_mu": self.options.mu}

    @classmethod
    def site_gradient_hook(cls, params: list[tuple[str, nn.Parameter]], reference: Mapping[str, torch.Tensor],
                           site_options: Mapping[str, float]) -> Callable[[], None] | None:
        mu = float(site_options.get("proximal_mu", 0.0))
        return ProximalGradient(params, reference, mu) if mu else None


def proximal_term(model: nn.Module, reference: Mapping[str, torch.Tensor], mu: float) -> torch.Tensor:
    """``mu/2 * sum ||w - w_ref||^2`` over the model's trainable parameters, to add to the local loss.

    ``reference`` is the round's global state (parameter names as in ``model.named_parameters()``); it is
    treated as a constant, so the gradient is ``mu * (w - w_ref)``. Frozen parameters and buffers (the
    feature mean and std) are left out: they do not train, so they cannot drift.
    """
    if mu < 0:
        raise ValueError(f"proximal mu must be >= 0, got {mu}")
    terms = []
    for name, w in model.named_parameters():
        if not w.requires_grad:
            continue
        if name not in reference:
            raise ValueError(f"the reference state has no parameter {name!r}; it is not this model's global state")
        ref = reference[name].detach().to(device=w.device, dtype=w.dtype)
        if ref.shape != w.shape:  # broadcasting would silently compute a wrong term
            raise ValueError(f"reference {name!r} has shape {tuple(ref.shape)}; the model's is {tuple(w.shape)}")
        terms.append(((w - ref) ** 2).sum())
    if not terms:
        raise ValueError("the model has no trainable parameters")
    return (mu / 2) * torch.stack(terms).sum()


class ProximalGradient:
    """Adds the proximal term's gradient ``mu * (w - w_ref)`` to each parameter's gradient after backward.

    The same update as adding :func:`proximal_term` to the loss, but it works on whatever each rank holds: a
    whole model (DDP: the term's gradient is the same on every rank, so averaging keeps it), an FSDP shard (a
    DTensor: the reference is sharded the same way once, here) or a pipeline stage (its own parameters only).
    The reported training loss is then the task's loss alone.
    """

    def __init__(self, params: Iterable[tuple[str, nn.Parameter]], reference: Mapping[str, torch.Tensor],
                 mu: float) -> None:
        from torch.distributed.tensor import DTensor, distribute_tensor

        if mu < 0:
            raise ValueError(f"proximal mu must be >= 0, got {mu}")
        self.mu = mu
        self.pairs: list[tuple[nn.Parameter, torch.Tensor]] = []
        for name, w in params:
            if not w.requires_grad:
                continue
            if name not in reference:
                raise ValueError(f"the reference state has no parameter {name!r}; it is not this model's global state")
            ref = reference[name].detach()
            full_shape = w.shape  # a DTensor's shape is the unsharded one
            if tuple(ref.shape) != tuple(full_shape):
                raise ValueError(f"reference {name!r} has shape {tuple(ref.shape)}; the model's is {tuple(full_shape)}")
            if isinstance(w, DTensor):  # collective over the parameter's mesh, once: every rank holds the same ref
                ref = distribute_tensor(ref.to(device=w.device, dtype=w.dtype), w.device_mesh, w.placements)
            else:
                ref = ref.to(device=w.device, dtype=w.dtype)
            self.pairs.append((w, ref))

    @torch.no_grad()
    def __call__(self) -> None:
        for w, ref in self.pairs:
            if w.grad is not None:
                w.grad.add_(w.detach() - ref, alpha=self.mu)
