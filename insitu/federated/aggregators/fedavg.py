"""FedAvg: the sample-weighted mean of the sites' model states (McMahan et al., 2017)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from insitu.federated.aggregators.base import Aggregator, State, Update


def fedavg(updates: Sequence[tuple[Mapping[str, torch.Tensor], int]]) -> State:
    """Average model states weighted by each site's number of training samples.

    Parameters
    ----------
    updates
        ``(state_dict, n_samples)`` per site; every state dict has the same keys and shapes.

    Returns
    -------
    dict
        The weighted mean of every floating-point tensor (accumulated in float64, returned in the input's
        dtype). Integer tensors (counters such as ``num_batches_tracked``) take the value of the site with
        the most samples.
    """
    if not updates:
        raise ValueError("fedavg needs at least one update")
    total = sum(n for _, n in updates)
    if total <= 0 or any(n < 0 for _, n in updates):
        raise ValueError(f"sample counts must be non-negative and sum to > 0, got {[n for _, n in updates]}")
    keys = list(updates[0][0])
    for state, _ in updates[1:]:
        if list(state) != keys:
            raise ValueError("updates have different parameter names; sites trained different models")
    largest = max(updates, key=lambda u: u[1])[0]
    if len(updates) == 1:  # the mean of one state is that state (exactly: its weight is 1); no float64 copy of it
        return {k: v.detach().clone() for k, v in updates[0][0].items()}
    out: State = {}
    for k in keys:
        ref = updates[0][0][k]
        if not ref.is_floating_point():
            out[k] = largest[k].clone()
            continue
        acc = torch.zeros_like(ref, dtype=torch.float64)
        for state, n in updates:
            if state[k].shape != ref.shape:
                raise ValueError(f"parameter {k!r} has shape {tuple(state[k].shape)} vs {tuple(ref.shape)}")
            acc += state[k].to(torch.float64) * (n / total)
        out[k] = acc.to(ref.dtype)
    return out


class FedAvg(Aggregator):
    """The sample-weighted mean; stateless."""

    name = "fedavg"
    runs_in_async_mode = True  # FedAsync's paper trains sites with plain local SGD (or FedProx's term)
    mean_based = True

    def _aggregate(
        self,
        rnd: int,
        global_state: Mapping[str, torch.Tensor],
        updates: list[Update],
        server_state: Mapping[str, torch.Tensor] | None,
    ) -> tuple[State, None]:
        return fedavg([(u.state, u.n_samples) for u in updates]), None
