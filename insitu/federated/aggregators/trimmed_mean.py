"""Coordinate-wise trimmed mean (Yin et al., 2018): per weight, drop the ``floor(beta * n)`` largest and as many
smallest site values, average the rest, unweighted.

Tolerates up to ``floor(beta * n)`` wild updates per coordinate while averaging more of the honest values than
the median does. With few sites ``floor(beta * n)`` is often 0 (beta 0.1 trims nothing below 10 sites), and then
it is the plain unweighted mean: raise beta for small federations.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated

import torch
from pydantic import Field

from insitu.federated.aggregators.base import Aggregator, State, Update, floating, stacked


class TrimmedMean(Aggregator):
    name = "trimmed_mean"

    class Options(Aggregator.Options):
        beta: Annotated[float, Field(ge=0.0, lt=0.5)] = 0.1  # fraction trimmed at each end

    options: Options

    def trimmed(self, n: int) -> int:
        """How many values are dropped at each end among ``n``; beta < 0.5 always leaves at least one."""
        # The epsilon: 0.29 * 100 is 28.999999999999996 in floating point, and must trim 29.
        return math.floor(self.options.beta * n + 1e-9)

    def _aggregate(
        self,
        rnd: int,
        global_state: Mapping[str, torch.Tensor],
        updates: list[Update],
        server_state: Mapping[str, torch.Tensor] | None,
    ) -> tuple[State, None]:
        n = len(updates)
        t = self.trimmed(n)
        out: State = {}
        for k in floating(global_state):
            out[k] = stacked(updates, k).sort(dim=0).values[t:n - t].mean(dim=0)
        return out, None
