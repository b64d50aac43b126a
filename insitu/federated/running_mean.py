"""The sample-weighted mean of the sites' updates, taken one update at a time, so that the coordinator of a round
holds the global model, this mean and the one update it is reading, whatever the number of sites.

For an aggregator whose result depends on the updates only through that mean (``Aggregator.mean_based``: FedAvg,
FedProx, FedAdam/FedYogi/FedAdagrad), aggregating the one mean as a single update of all the samples gives the
same global model as aggregating every update. A coordinate-wise statistic (median, trimmed mean) needs every
update at once and does not stream.

The mean is updated in place (West 1979): ``mean ← mean + (n_k / N_k) · (x_k − mean)``, with ``N_k`` the samples so far,
in each tensor's own dtype (float32 for fp16/bf16): no float64 copy of the model, and no sum that grows with the
number of sites.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from insitu.federated.aggregators.base import State, Update


class RunningMean:
    """Add updates with :meth:`add`; :meth:`as_update` is their weighted mean as one update of all the samples.

    Integer tensors (counters) are those of the update with the most samples (the first of equals), as
    :meth:`insitu.federated.aggregators.Aggregator.aggregate` takes them.
    """

    def __init__(self) -> None:
        self.mean: State | None = None
        self.total = 0
        self.sites: list[str] = []
        self._largest = -1
        self._dtypes: dict[str, torch.dtype] = {}

    def add(self, site: str, state: Mapping[str, torch.Tensor], n_samples: int) -> None:
        """Fold one update into the mean (``state`` may be dropped afterwards)."""
        if n_samples < 0:
            raise ValueError(f"update from site {site!r} has sample count {n_samples}")
        self.sites.append(site)
        if self.mean is None:
            # fp16/bf16 tensors are averaged in float32 (rounding would build up over hundreds of sites)
            self._dtypes = {k: v.dtype for k, v in state.items()}
            self.mean = {k: v.detach().to(torch.promote_types(torch.float32, v.dtype), copy=True)
                         if v.is_floating_point() else v.detach().clone() for k, v in state.items()}
            self.total, self._largest = n_samples, n_samples
            return
        self.total += n_samples
        share = n_samples / self.total if self.total else 0.0
        for k, v in state.items():
            acc = self.mean[k]
            if acc.is_floating_point():
                if share:  # in place, no model-sized temporary: mean·(1 − share) + x·share
                    acc.mul_(1.0 - share).add_(v.detach().to(acc.dtype), alpha=share)
            elif n_samples > self._largest:
                acc.copy_(v)
        self._largest = max(self._largest, n_samples)

    def as_update(self) -> Update:
        if self.mean is None:
            raise ValueError("no update was added")
        return Update("+".join(self.sites), {k: v.to(self._dtypes[k]) for k, v in self.mean.items()}, self.total)
