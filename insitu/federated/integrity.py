"""Whether the model about to be registered is the one this coordinator aggregated: a pure decision.

The exchange is a shared store; between aggregation and registration its weights could have been replaced. The
coordinator kept the SHA-256 of every global model it made (a round's result), so it registers a model only when
the manifest on the exchange still names that hash. ``retrain``'s ``register`` raises what this says.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def aggregated_sha256(results: Sequence[dict[str, Any]], selected: int) -> str | None:
    """The hash this coordinator recorded for global model ``selected`` (None for model 0, the initial weights,
    which no round aggregated)."""
    return results[selected - 1]["sha256"] if selected > 0 else None


def registration_refusal(name: str, on_exchange: str, aggregated: str | None) -> str | None:
    """Why the weights ``name`` whose manifest says ``on_exchange`` may not be registered (None: they may)."""
    if not aggregated or on_exchange == aggregated:
        return None
    return (f"the weights of {name} on the exchange ({on_exchange[:12]}…) are not the ones this coordinator "
            f"aggregated ({aggregated[:12]}…); refusing to register them")
