"""FedAdagrad (Reddi et al., 2021): v is the running sum of delta^2, so steps shrink as rounds accumulate."""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import Field

from insitu.federated.aggregators.fedopt import FedOpt


class FedAdagrad(FedOpt):
    name = "fedadagrad"
    mean_based = True  # its server step sees the sites only through their weighted mean

    class Options(FedOpt.Options):
        # v only grows, so the step shrinks; a larger start than Adam/Yogi's (Flower's default) compensates.
        eta: Annotated[float, Field(gt=0.0)] = 0.1

    options: Options

    def second_moment(self, v: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return v + delta**2
