"""FedYogi (Reddi et al., 2021): v moves towards delta^2 by a fixed fraction of delta^2, so it grows or shrinks
additively (Zaheer et al., 2018) rather than forgetting exponentially as Adam's does."""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import Field

from insitu.federated.aggregators.fedopt import FedOpt


class FedYogi(FedOpt):
    name = "fedyogi"
    mean_based = True  # its server step sees the sites only through their weighted mean

    class Options(FedOpt.Options):
        beta_2: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.99  # decay of the second moment

    options: Options

    def second_moment(self, v: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        d2 = delta**2
        return v - (1 - self.options.beta_2) * d2 * torch.sign(v - d2)
