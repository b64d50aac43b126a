"""FedAvg: the sample-weighted mean of site states, checked against hand-computed numbers."""

from __future__ import annotations

import pytest
import torch

from insitu.federated.fedavg import fedavg


def _state(w: list[list[float]], b: list[float], batches: int) -> dict[str, torch.Tensor]:
    return {
        "layer.weight": torch.tensor(w, dtype=torch.float32),
        "layer.bias": torch.tensor(b, dtype=torch.float32),
        "bn.num_batches_tracked": torch.tensor(batches, dtype=torch.int64),
    }


def test_two_sites_weighted_100_and_300() -> None:
    # weights 100/(100+300) = 0.25 and 300/400 = 0.75
    a = _state([[1.0, 2.0], [3.0, 4.0]], [0.0, 4.0], batches=7)
    b = _state([[5.0, 6.0], [7.0, 8.0]], [4.0, 0.0], batches=3)
    out = fedavg([(a, 100), (b, 300)])

    assert list(out) == ["layer.weight", "layer.bias", "bn.num_batches_tracked"]
    # 0.25*1 + 0.75*5 = 4, 0.25*2 + 0.75*6 = 5, ...
    assert torch.equal(out["layer.weight"], torch.tensor([[4.0, 5.0], [6.0, 7.0]]))
    # 0.25*0 + 0.75*4 = 3, 0.25*4 + 0.75*0 = 1
    assert torch.equal(out["layer.bias"], torch.tensor([3.0, 1.0]))
    assert out["layer.weight"].dtype == torch.float32
    # integer buffer: taken from the site with the most samples (b, the second one), not averaged
    assert out["bn.num_batches_tracked"].dtype == torch.int64
    assert int(out["bn.num_batches_tracked"]) == 3


def test_three_sites_hand_computed() -> None:
    # counts 10, 20, 70 -> weights 0.1, 0.2, 0.7
    s1 = {"w": torch.tensor([1.0, -2.0]), "step": torch.tensor(11)}
    s2 = {"w": torch.tensor([2.0, 0.0]), "step": torch.tensor(22)}
    s3 = {"w": torch.tensor([5.0, 10.0]), "step": torch.tensor(33)}
    out = fedavg([(s1, 10), (s3, 70), (s2, 20)])
    # 0.1*1 + 0.2*2 + 0.7*5 = 4.0 ; 0.1*-2 + 0.2*0 + 0.7*10 = 6.8
    assert torch.allclose(out["w"], torch.tensor([4.0, 6.8]), atol=1e-6)
    assert int(out["step"]) == 33  # the 70-sample site, listed in the middle


def test_single_site_is_identity_and_inputs_untouched() -> None:
    s = {"w": torch.tensor([1.5, -0.5]), "n": torch.tensor(4)}
    before = {k: v.clone() for k, v in s.items()}
    out = fedavg([(s, 9)])
    assert torch.equal(out["w"], before["w"])
    assert int(out["n"]) == 4
    out["n"] += 1  # the integer buffer is a copy, not the site's tensor
    out["w"] += 1
    assert torch.equal(s["w"], before["w"]) and int(s["n"]) == 4


def test_zero_sample_site_contributes_nothing() -> None:
    a = {"w": torch.tensor([100.0])}
    b = {"w": torch.tensor([2.0])}
    out = fedavg([(a, 0), (b, 50)])
    assert torch.equal(out["w"], torch.tensor([2.0]))


def test_float64_precision_kept() -> None:
    a = {"w": torch.tensor([1.0], dtype=torch.float64)}
    b = {"w": torch.tensor([2.0], dtype=torch.float64)}
    out = fedavg([(a, 1), (b, 2)])
    assert out["w"].dtype == torch.float64
    assert out["w"].item() == pytest.approx(5.0 / 3.0, abs=1e-15)


def test_empty_updates_raise() -> None:
    with pytest.raises(ValueError, match="at least one"):
        fedavg([])


@pytest.mark.parametrize("counts", [(0, 0), (0,), (-5, 10)])
def test_bad_sample_counts_raise(counts: tuple[int, ...]) -> None:
    updates = [({"w": torch.tensor([1.0])}, n) for n in counts]
    with pytest.raises(ValueError, match="sample counts"):
        fedavg(updates)


def test_mismatched_keys_raise() -> None:
    a = {"w": torch.tensor([1.0]), "b": torch.tensor([0.0])}
    b = {"w": torch.tensor([1.0]), "c": torch.tensor([0.0])}
    with pytest.raises(ValueError, match="different parameter names"):
        fedavg([(a, 1), (b, 1)])
    with pytest.raises(ValueError, match="different parameter names"):
        fedavg([(a, 1), ({"w": torch.tensor([1.0])}, 1)])


def test_mismatched_shapes_raise() -> None:
    a = {"w": torch.zeros(2, 3)}
    b = {"w": torch.zeros(3, 2)}
    with pytest.raises(ValueError, match=r"'w' has shape \(3, 2\) vs \(2, 3\)"):
        fedavg([(a, 1), (b, 1)])
