"""FedProx: what sites are told (mu), the server side (FedAvg), and the proximal term's value and gradient."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from insitu.federated.aggregators import FedAvg, FedProx, Update, build_aggregator, proximal_term


def test_configure_sends_mu_every_round() -> None:
    assert FedProx().configure(1) == {"proximal_mu": 0.01}
    agg = build_aggregator("fedprox", {"mu": 0.5})
    assert [agg.configure(r) for r in (1, 2, 30)] == [{"proximal_mu": 0.5}] * 3


def test_aggregation_is_fedavg() -> None:
    g = {"w": torch.tensor([0.0, 0.0]), "n": torch.tensor(0)}
    ups = [Update("eu", {"w": torch.tensor([1.0, 3.0]), "n": torch.tensor(1)}, 1),
           Update("us", {"w": torch.tensor([5.0, -1.0]), "n": torch.tensor(2)}, 3)]
    out, state = FedProx(FedProx.Options(mu=1.0)).aggregate(1, g, ups, None)
    ref, _ = FedAvg().aggregate(1, g, ups, None)
    assert torch.equal(out["w"], torch.tensor([4.0, 0.0]))  # 0.25*1 + 0.75*5, 0.25*3 - 0.75*1
    assert torch.equal(out["w"], ref["w"]) and int(out["n"]) == 2 and state is None


def _linear(w: list[float], b: float) -> nn.Linear:
    m = nn.Linear(2, 1)
    with torch.no_grad():
        m.weight.copy_(torch.tensor([w]))
        m.bias.fill_(b)
    return m


def test_proximal_term_value_and_gradient() -> None:
    model = _linear([1.0, 2.0], 0.5)
    ref = {"weight": torch.tensor([[0.0, 0.0]]), "bias": torch.tensor([1.5])}
    term = proximal_term(model, ref, mu=0.2)
    # 0.2/2 * ((1-0)^2 + (2-0)^2 + (0.5-1.5)^2) = 0.1 * 6 = 0.6
    assert term.item() == pytest.approx(0.6)
    term.backward()
    # d/dw mu/2 ||w - ref||^2 = mu (w - ref): the reference is a constant
    assert torch.allclose(model.weight.grad, torch.tensor([[0.2, 0.4]]))
    assert torch.allclose(model.bias.grad, torch.tensor([-0.2]))
    assert not ref["weight"].requires_grad


def test_frozen_parameters_and_buffers_are_left_out() -> None:
    model = _linear([1.0, 2.0], 0.5)
    model.register_buffer("mean", torch.tensor([100.0]))
    model.bias.requires_grad_(False)
    ref = {"weight": torch.tensor([[1.0, 1.0]]), "bias": torch.tensor([-100.0]), "mean": torch.tensor([0.0])}
    # only the weight counts: 1/2 * (0^2 + 1^2) = 0.5
    assert proximal_term(model, ref, mu=1.0).item() == pytest.approx(0.5)


def test_zero_mu_is_zero_and_at_the_reference_is_zero() -> None:
    model = _linear([1.0, 2.0], 0.5)
    ref = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert proximal_term(model, {"weight": torch.zeros(1, 2), "bias": torch.zeros(1)}, 0.0).item() == 0.0
    assert proximal_term(model, ref, 10.0).item() == 0.0


def test_reference_must_match_the_model() -> None:
    model = _linear([1.0, 2.0], 0.5)
    with pytest.raises(ValueError, match="no parameter 'bias'"):
        proximal_term(model, {"weight": torch.zeros(1, 2)}, 0.1)
    with pytest.raises(ValueError, match=r"'weight' has shape \(2,\); the model's is \(1, 2\)"):
        proximal_term(model, {"weight": torch.zeros(2), "bias": torch.zeros(1)}, 0.1)
    with pytest.raises(ValueError, match="mu must be >= 0"):
        proximal_term(model, {"weight": torch.zeros(1, 2), "bias": torch.zeros(1)}, -0.1)


def test_the_term_keeps_local_training_near_the_global_model() -> None:
    # A site whose data pull the weights far from the global model drifts less with the term than without.
    torch.manual_seed(0)
    x = torch.randn(64, 2)
    y = x @ torch.tensor([[5.0], [-5.0]])
    start = _linear([0.0, 0.0], 0.0)
    ref = {k: v.detach().clone() for k, v in start.state_dict().items()}

    def drift(mu: float) -> float:
        model = _linear([0.0, 0.0], 0.0)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for _ in range(200):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y) + proximal_term(model, ref, mu)
            loss.backward()
            opt.step()
        return float(model.weight.detach().norm())

    free, held = drift(0.0), drift(5.0)
    assert free > 6.0  # close to ||(5, -5)|| = 7.07
    assert held < 0.5 * free
