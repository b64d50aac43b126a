"""FedAdam (Reddi et al., 2021): the server's second moment is an exponential average of delta^2, as in Adam."""

from __future__ import annotations

import math
from typing import Annotated

import torch
from pydantic import Field

from insitu.federated.aggregators.fedopt import FedOpt


class FedAdam(FedOpt):
    name = "fedadam"
    mean_based = True  # its server step sees the sites only through their weighted mean

    class Options(FedOpt.Options):
        beta_2: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.99  # decay of the second moment

    options: Options

    def second_moment(self, v: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        b2 = self.options.beta_2
        return b2 * v + (1 - b2) * delta**2

    def step_size(self, step: int) -> float:
        # Adam's bias correction (as Flower's FedAdam): m and v start at zero, so early averages are too small.
        o = self.options
        return o.eta * math.sqrt(1 - o.beta_2**step) / (1 - o.beta_1**step)
