"""FedYogi by hand: v moves additively towards delta^2, up or down, without bias correction."""

from __future__ import annotations

import math

import pytest
import torch

from insitu.federated.aggregators import FedAdam, FedYogi, Update

OPTS = FedYogi.Options(eta=1.0, beta_1=0.5, beta_2=0.75, tau=0.5)


def test_second_moment_rule() -> None:
    v = torch.tensor([1.0, 10.0, 4.0], dtype=torch.float64)
    d = torch.tensor([3.0, 2.0, 2.0], dtype=torch.float64)
    # d^2 = (9, 4, 4). v < d^2: v + 0.25*9 = 3.25; v > d^2: v - 0.25*4 = 9; v == d^2: unchanged.
    assert FedYogi(OPTS).second_moment(v, d).tolist() == [3.25, 9.0, 4.0]
    # Adam would forget multiplicatively instead: 0.75*10 + 0.25*4 = 8.5 for the middle one.
    assert FedAdam(FedAdam.Options(beta_2=0.75)).second_moment(v, d).tolist()[1] == 8.5


def test_two_rounds_by_hand() -> None:
    g = {"w": torch.tensor([0.0, 1.0], dtype=torch.float64)}
    ups = [Update("eu", {"w": torch.tensor([5.0, 1.0], dtype=torch.float64)}, 1),
           Update("us", {"w": torch.tensor([1.0, 0.0], dtype=torch.float64)}, 3)]  # average (2, 0.25)
    agg = FedYogi(OPTS)
    g1, s1 = agg.aggregate(1, g, ups, None)
    # delta = (2, -0.75); v from 0 grows by 0.25*delta^2 = (1, 0.140625); m = (1, -0.375); no bias correction:
    # x = (1/(1 + 0.5), 1 - 0.375/(0.375 + 0.5)) = (2/3, 4/7)
    assert s1["v.w"].tolist() == pytest.approx([1.0, 0.140625])
    assert g1["w"].tolist() == pytest.approx([2 / 3, 4 / 7], abs=1e-12)
    g2, s2 = agg.aggregate(2, g1, ups, s1)
    # delta = (4/3, -9/28): coordinate 0 has v = 1 < 16/9, v grows: 1 + 0.25*16/9;
    # coordinate 1 has v = 0.140625 > 81/784, v shrinks: 0.140625 - 0.25*81/784
    v = [1 + 0.25 * 16 / 9, 0.140625 - 0.25 * 81 / 784]
    m = [0.5 + 0.5 * 4 / 3, -0.1875 - 0.5 * 9 / 28]
    assert s2["v.w"].tolist() == pytest.approx(v, abs=1e-12)
    assert g2["w"].tolist() == pytest.approx([2 / 3 + m[0] / (math.sqrt(v[0]) + 0.5),
                                              4 / 7 + m[1] / (math.sqrt(v[1]) + 0.5)], abs=1e-12)
