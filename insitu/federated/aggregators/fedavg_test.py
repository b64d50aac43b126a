"""FedAvg as an aggregator: weighted by samples, stateless, and (unlike median) dragged by one wild update.

The ``fedavg`` function itself is tested in tests/unit/test_fedavg.py, through its old import path.
"""

from __future__ import annotations

import torch

import insitu.federated.fedavg as old_path
from insitu.federated.aggregators import FedAvg, Update
from insitu.federated.aggregators.fedavg import fedavg


def test_old_import_path_is_the_same_function() -> None:
    assert old_path.fedavg is fedavg


def test_weighted_by_samples_and_stateless() -> None:
    g = {"w": torch.tensor([0.0, 0.0]), "b": torch.tensor([9.0])}
    updates = [Update("eu", {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0])}, 100),
               Update("us", {"w": torch.tensor([5.0, 6.0]), "b": torch.tensor([4.0])}, 300)]
    out, state = FedAvg().aggregate(1, g, updates, None)
    # weights 0.25, 0.75: 0.25*1 + 0.75*5 = 4, 0.25*2 + 0.75*6 = 5, 0.25*0 + 0.75*4 = 3
    assert torch.equal(out["w"], torch.tensor([4.0, 5.0]))
    assert torch.equal(out["b"], torch.tensor([3.0]))
    assert state is None
    # The global's values play no part, nor does a state handed in (say, from before a switch of aggregator).
    out2, _ = FedAvg().aggregate(7, {"w": torch.tensor([50.0, -50.0]), "b": torch.tensor([0.0])}, updates,
                                 {"step": torch.tensor(3)})
    assert torch.equal(out2["w"], out["w"])


def test_one_wild_update_drags_the_mean() -> None:
    # Four honest sites at 1..4 and one at 1000, equal samples: the mean is (1+2+3+4+1000)/5 = 202.
    g = {"w": torch.tensor([0.0])}
    updates = [Update(f"s{i}", {"w": torch.tensor([v])}, 10) for i, v in enumerate([1.0, 2.0, 3.0, 4.0, 1000.0])]
    out, _ = FedAvg().aggregate(1, g, updates, None)
    assert torch.equal(out["w"], torch.tensor([202.0]))
