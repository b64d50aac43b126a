"""How much an update trained from an older global version counts: FedAsync's staleness functions s(τ).

τ (tau) is the staleness of an update: the newest global version when it arrives minus the version it was
trained from. Xie et al. (2019, "Asynchronous Federated Optimization", §5.2) weight an update by
α·s(τ) with s(0) = 1 and s non-increasing, so that an update from far behind moves the model less.
"""

from __future__ import annotations

from insitu.conf import StalenessConfig


def staleness_weight(config: StalenessConfig, staleness: int) -> float:
    """s(staleness) in (0, 1] for the configured function.

    - ``constant``: 1, whatever the staleness;
    - ``polynomial``: (1 + τ)^-a;
    - ``hinge``: 1 while τ ≤ b, then 1 / (a·(τ − b) + 1).

    Raises
    ------
    ValueError
        For a negative staleness (an update claiming a version that does not exist yet).
    """
    if staleness < 0:
        raise ValueError(f"staleness {staleness} < 0: an update cannot be trained from a future version")
    if config.function == "constant":
        return 1.0
    if config.function == "polynomial":
        return float((1.0 + staleness) ** -config.a)
    if staleness <= config.b:
        return 1.0
    return 1.0 / (config.a * (staleness - config.b) + 1.0)
