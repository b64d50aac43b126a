"""An aggregator in one file: the global model becomes the first site's update (a rule no built-in one has)."""

from collections.abc import Mapping

import torch

from insitu.federated.aggregators.base import Aggregator, State, Update, floating


class DummyFirst(Aggregator):
    name = "dummy_first"

    def _aggregate(self, rnd: int, global_state: Mapping[str, torch.Tensor], updates: list[Update],
                   server_state: Mapping[str, torch.Tensor] | None) -> tuple[State, None]:
        return {k: updates[0].state[k].clone() for k in floating(global_state)}, None
