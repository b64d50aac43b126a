"""FedAdam by hand: two rounds of Reddi et al.'s Algorithm 2 with Adam's v and bias correction."""

from __future__ import annotations

import math

import pytest
import torch

from insitu.federated.aggregators import FedAdam, Update

G = {"w": torch.tensor([0.0, 1.0], dtype=torch.float64)}
# Weighted 1:3, the sites average to (0.25*5 + 0.75*1, 0.25*1 + 0.75*0) = (2, 0.25) whatever the global is.
UPDATES = [Update("eu", {"w": torch.tensor([5.0, 1.0], dtype=torch.float64)}, 1),
           Update("us", {"w": torch.tensor([1.0, 0.0], dtype=torch.float64)}, 3)]
OPTS = FedAdam.Options(eta=1.0, beta_1=0.5, beta_2=0.75, tau=0.5)


def test_two_rounds_by_hand() -> None:
    agg = FedAdam(OPTS)
    g1, s1 = agg.aggregate(1, G, UPDATES, None)
    # delta = (2, -0.75); m = 0.5*delta = (1, -0.375); v = 0.25*delta^2 = (1, 0.140625);
    # eta_1 = 1 * sqrt(1 - 0.75) / (1 - 0.5) = 1; x = (0 + 1/(1 + 0.5), 1 - 0.375/(0.375 + 0.5)) = (2/3, 4/7)
    assert torch.allclose(s1["m.w"], torch.tensor([1.0, -0.375], dtype=torch.float64))
    assert torch.allclose(s1["v.w"], torch.tensor([1.0, 0.140625], dtype=torch.float64))
    assert torch.allclose(g1["w"], torch.tensor([2 / 3, 4 / 7], dtype=torch.float64), atol=1e-12)

    g2, s2 = agg.aggregate(2, g1, UPDATES, s1)
    # delta = (2 - 2/3, 0.25 - 4/7) = (4/3, -9/28)
    m = [0.5 * 1 + 0.5 * 4 / 3, 0.5 * -0.375 + 0.5 * -9 / 28]
    v = [0.75 * 1 + 0.25 * (4 / 3) ** 2, 0.75 * 0.140625 + 0.25 * (9 / 28) ** 2]
    eta2 = math.sqrt(1 - 0.75**2) / (1 - 0.5**2)
    x = [2 / 3 + eta2 * m[0] / (math.sqrt(v[0]) + 0.5), 4 / 7 + eta2 * m[1] / (math.sqrt(v[1]) + 0.5)]
    assert s2["m.w"].tolist() == pytest.approx(m, abs=1e-12)
    assert s2["v.w"].tolist() == pytest.approx(v, abs=1e-12)
    assert g2["w"].tolist() == pytest.approx(x, abs=1e-12)
    assert int(s2["step"]) == 2


def test_bias_correction_makes_the_first_step_about_eta() -> None:
    # With the defaults, the zero-started moments corrected, a first step is ~eta * sign(delta) for a large
    # delta: eta * sqrt(1-b2) * |d| / (sqrt(1-b2) * |d| + tau).
    g = {"w": torch.tensor([0.0, 0.0])}
    out, _ = FedAdam().aggregate(1, g, [Update("eu", {"w": torch.tensor([3.0, -0.5])}, 1)], None)
    expected = [0.01 * 0.1 * 3 / (0.1 * 3 + 1e-3), -0.01 * 0.1 * 0.5 / (0.1 * 0.5 + 1e-3)]
    assert out["w"].tolist() == pytest.approx(expected, rel=1e-6)


def test_moments_kept_in_float32_for_a_float32_model() -> None:
    g = {"w": torch.zeros(3, 2)}
    _, s = FedAdam().aggregate(1, g, [Update("eu", {"w": torch.ones(3, 2)}, 1)], None)
    assert s["m.w"].dtype == s["v.w"].dtype == torch.float32 and s["m.w"].shape == (3, 2)
    assert torch.allclose(s["m.w"], torch.full((3, 2), 0.1)) and torch.allclose(s["v.w"], torch.full((3, 2), 0.01))
