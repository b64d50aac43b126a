"""FedAvg, kept importable from its old place; it lives with the other aggregators now."""

from __future__ import annotations

from insitu.federated.aggregators.fedavg import fedavg

__all__ = ["fedavg"]
