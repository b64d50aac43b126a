"""Which failures are worth a retry: transient ones (a lost worker, a timeout, a refused connection), not the
ones that would fail the same way again (bad configuration or data, a refusal by policy or protocol)."""

from __future__ import annotations

from typing import Any

from insitu.federated.kinds import ExchangeError
from insitu.federated.site_rounds import ValidationFailed
from insitu.outage import StoreUnavailable

DETERMINISTIC: tuple[type[BaseException], ...] = (
    ValueError,  # ConfigError, schema and data errors ("no samples", a type rule): the same input fails again
    TypeError,
    KeyError,
    PermissionError,  # PolicyRefused, ResidencyError, IdentityError, StorageAccessError: a decision, not a fault
    NotImplementedError,
    ExchangeError,  # the protocol refused an artefact: its writer would write the same one again
    StoreUnavailable,  # a store stayed down for its whole outage bound: the bound is the operator's, not doubled
    ValidationFailed,  # the round's validation failed after its own retries: training again would not mend it
)


def failure_of(state: Any) -> BaseException | None:
    """The exception a Failed state carries (Prefect keeps it as the state's data)."""
    data = getattr(state, "data", None)
    if isinstance(data, BaseException):
        return data
    try:
        out = state.result(raise_on_failure=False)
    except Exception as e:  # the result may not be retrievable: treat as unknown
        return e if isinstance(e, DETERMINISTIC) else None
    return out if isinstance(out, BaseException) else None


def retry_if_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry unless the failure is deterministic."""
    exc = failure_of(state)
    return not isinstance(exc, DETERMINISTIC)
