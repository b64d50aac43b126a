"""What FedAdam, FedYogi and FedAdagrad share: the server state's layout, storing it, resuming from it, and the
checks that keep a state from another model out. Each rule's numbers are in its own <name>_test.py."""

from __future__ import annotations

import io

import pytest
import torch

from insitu.federated.aggregators import FedAdagrad, FedAdam, FedOpt, FedYogi, Update, build_aggregator
from insitu.federated.states import check_state

NAMES = ["fedadam", "fedyogi", "fedadagrad"]


def _global() -> dict[str, torch.Tensor]:
    return {"w": torch.tensor([[0.0, 1.0], [2.0, 3.0]]), "half": torch.tensor([0.5], dtype=torch.float16),
            "mean": torch.tensor([10.0, 20.0]), "count": torch.tensor(4, dtype=torch.int64)}


def _updates(g: dict[str, torch.Tensor], shift: float) -> list[Update]:
    """Three sites that moved ``w`` and ``half`` by different amounts and left ``mean`` (a buffer) alone."""
    out = []
    for i, (site, n) in enumerate([("eu", 10), ("us", 30), ("apac", 20)]):
        s = {k: v.clone() for k, v in g.items()}
        s["w"] = g["w"] + shift * (i + 1) - 0.3 * i
        s["half"] = g["half"] + torch.tensor([0.25 * (i - 1)], dtype=torch.float16)
        s["count"] = torch.tensor(100 + i)
        out.append(Update(site, s, n))
    return out


def _run(agg: FedOpt, rounds: int, state: dict[str, torch.Tensor] | None = None,
         g: dict[str, torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
    g = g if g is not None else _global()
    for r in range(1, rounds + 1):
        g, state = agg.aggregate(r, g, _updates(g, shift=0.5 / r), state)
    return g, state


def test_the_family() -> None:
    assert all(issubclass(c, FedOpt) for c in (FedAdam, FedYogi, FedAdagrad))
    assert FedAdam.Options().eta == FedYogi.Options().eta == 0.01 and FedAdagrad.Options().eta == 0.1
    assert (FedAdam.Options().beta_1, FedAdam.Options().beta_2, FedAdam.Options().tau) == (0.9, 0.99, 1e-3)


@pytest.mark.parametrize("name", NAMES)
def test_state_layout(name: str) -> None:
    g = _global()
    _, state = _run(build_aggregator(name), 1)
    assert state is not None
    # Moments for the floating-point tensors only, in each one's shape and dtype; one int64 step counter.
    assert set(state) == {"m.w", "v.w", "m.half", "v.half", "m.mean", "v.mean", "step"}
    for k in ("w", "half", "mean"):
        for p in ("m", "v"):
            assert state[f"{p}.{k}"].shape == g[k].shape and state[f"{p}.{k}"].dtype == g[k].dtype
    assert state["step"].dtype == torch.int64 and state["step"].shape == () and int(state["step"]) == 1
    assert bool((state["v.w"] >= 0).all()) and bool((state["v.w"] > 0).any())
    _, state = _run(build_aggregator(name), 3)
    assert int(state["step"]) == 3


@pytest.mark.parametrize("name", NAMES)
def test_state_can_be_stored_on_the_exchange(name: str) -> None:
    _, state = _run(build_aggregator(name), 2)
    check_state(state, "server state")  # names, dtypes, finiteness as the exchange requires


@pytest.mark.parametrize("name", NAMES)
def test_resume_from_stored_state_equals_continuing(name: str) -> None:
    agg = build_aggregator(name)
    g2, state2 = _run(agg, 2)
    g3, state3 = agg.aggregate(3, g2, _updates(g2, 0.5 / 3), state2)
    # A new coordinator process: the state went to bytes and back, and a fresh aggregator picks it up.
    buf = io.BytesIO()
    torch.save(state2, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    g3r, state3r = build_aggregator(name).aggregate(3, g2, _updates(g2, 0.5 / 3), loaded)
    assert all(torch.equal(g3[k], g3r[k]) for k in g3)
    assert all(torch.equal(state3[k], state3r[k]) for k in state3)
    # Forgetting the state is not the same: the moments matter.
    g3_fresh, _ = build_aggregator(name).aggregate(3, g2, _updates(g2, 0.5 / 3), None)
    assert not torch.equal(g3_fresh["w"], g3["w"])


@pytest.mark.parametrize("name", NAMES)
def test_unmoved_tensors_and_integers(name: str) -> None:
    g, _ = _run(build_aggregator(name), 3)
    assert torch.equal(g["mean"], _global()["mean"])  # zero pseudo-gradient: exactly unchanged
    assert int(g["count"]) == 101  # from the 30-sample site, passed through
    assert not torch.equal(g["w"], _global()["w"])


@pytest.mark.parametrize("name", NAMES)
def test_moves_towards_the_sites(name: str) -> None:
    # Every site moved w up (shift 0.5*(i+1) - 0.3*i > 0): the server step goes up too, and is at most
    # about eta per coordinate per round (m / sqrt(v) is bounded near 1 for a steady pseudo-gradient).
    agg = build_aggregator(name)
    g1, _ = _run(agg, 1)
    step = g1["w"] - _global()["w"]
    assert bool((step > 0).all())
    assert bool((step <= agg.options.eta * 1.01).all())


def _bad(state: dict[str, torch.Tensor], **change: torch.Tensor | None) -> dict[str, torch.Tensor]:
    out = dict(state)
    for k, v in change.items():
        k = k.replace("__", ".")
        if v is None:
            out.pop(k)
        else:
            out[k] = v
    return out


@pytest.mark.parametrize("name", NAMES)
def test_a_state_from_another_model_is_refused(name: str) -> None:
    _, state = _run(build_aggregator(name), 1)
    g = _global()
    agg = build_aggregator(name)
    cases = [
        (_bad(state, m__w=None), r"does not belong to this model: extra \[\], missing \['m.w'\]"),
        (_bad(state, m__other=torch.zeros(1)), r"extra \['m.other'\], missing \[\]"),
        (_bad(state, v__w=torch.zeros(3)), r"server state 'v.w' has shape \(3,\); the parameter's is \(2, 2\)"),
        (_bad(state, m__w=torch.full((2, 2), float("nan"))), r"server state 'm.w' holds NaN"),
        (_bad(state, v__w=-torch.ones(2, 2)), r"'v.w' is negative"),
        (_bad(state, step=torch.tensor(1.0)), r"step must be one non-negative integer"),
        (_bad(state, step=torch.tensor([1, 2])), r"step must be one non-negative integer"),
    ]
    for bad, message in cases:
        with pytest.raises(ValueError, match=message):
            agg.aggregate(2, g, _updates(g, 0.1), bad)
