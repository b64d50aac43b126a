"""FedAdagrad by hand: v is the running sum of delta^2, so the same pseudo-gradient moves the model less later."""

from __future__ import annotations

import math

import pytest
import torch

from insitu.federated.aggregators import FedAdagrad, Update


def test_two_rounds_by_hand() -> None:
    g = {"w": torch.tensor([0.0, 1.0], dtype=torch.float64)}
    ups = [Update("eu", {"w": torch.tensor([5.0, 1.0], dtype=torch.float64)}, 1),
           Update("us", {"w": torch.tensor([1.0, 0.0], dtype=torch.float64)}, 3)]  # average (2, 0.25)
    agg = FedAdagrad(FedAdagrad.Options(eta=1.0, beta_1=0.5, tau=0.5))
    g1, s1 = agg.aggregate(1, g, ups, None)
    # delta = (2, -0.75); m = (1, -0.375); v = delta^2 = (4, 0.5625);
    # x = (1/(2 + 0.5), 1 - 0.375/(0.75 + 0.5)) = (0.4, 0.7)
    assert s1["v.w"].tolist() == pytest.approx([4.0, 0.5625])
    assert g1["w"].tolist() == pytest.approx([0.4, 0.7], abs=1e-12)
    g2, s2 = agg.aggregate(2, g1, ups, s1)
    # delta = (1.6, -0.45); m = (0.5 + 0.8, -0.1875 - 0.225) = (1.3, -0.4125); v = (4 + 2.56, 0.5625 + 0.2025)
    assert s2["v.w"].tolist() == pytest.approx([6.56, 0.765], abs=1e-12)
    assert s2["m.w"].tolist() == pytest.approx([1.3, -0.4125], abs=1e-12)
    assert g2["w"].tolist() == pytest.approx([0.4 + 1.3 / (math.sqrt(6.56) + 0.5),
                                              0.7 - 0.4125 / (math.sqrt(0.765) + 0.5)], abs=1e-12)


def test_the_same_pseudo_gradient_moves_less_each_round() -> None:
    # m is held at the pseudo-gradient (beta_1 = 0) and v only grows: steps 1/(1+tau), 1/(sqrt 2+tau), ...
    agg = FedAdagrad(FedAdagrad.Options(eta=1.0, beta_1=0.0, tau=1e-3))
    g, state, steps = {"w": torch.tensor([0.0], dtype=torch.float64)}, None, []
    for r in (1, 2, 3):
        new, state = agg.aggregate(r, g, [Update("eu", {"w": g["w"] + 1.0}, 1)], state)
        steps.append(float(new["w"] - g["w"]))
        g = new
    assert steps == pytest.approx([1 / (1 + 1e-3), 1 / (math.sqrt(2) + 1e-3), 1 / (math.sqrt(3) + 1e-3)])
