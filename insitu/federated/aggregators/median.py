"""Coordinate-wise median (Yin et al., 2018): each weight is the median of the sites' values, unweighted.

Robust to a minority of wild or malicious updates: one site cannot move a coordinate past the other sites'
values, whatever it sends. The price is statistical efficiency and ignoring how much data each site has.
With an even number of updates the median is the mean of the two middle values.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from insitu.federated.aggregators.base import Aggregator, State, Update, floating, stacked


class Median(Aggregator):
    name = "median"

    def _aggregate(
        self,
        rnd: int,
        global_state: Mapping[str, torch.Tensor],
        updates: list[Update],
        server_state: Mapping[str, torch.Tensor] | None,
    ) -> tuple[State, None]:
        n = len(updates)
        out: State = {}
        for k in floating(global_state):
            # Not torch.median: it returns the lower of the two middle values when n is even.
            s = stacked(updates, k).sort(dim=0).values
            out[k] = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
        return out, None
