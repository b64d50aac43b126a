"""Deterministic failures are not retried; transient ones are (the predicate Prefect calls on a Failed state)."""

from __future__ import annotations

import pytest
from prefect.states import Failed

from insitu.conf import ConfigError
from insitu.federated.kinds import ExchangeError
from insitu.governance.residency import ResidencyError
from tasks.retry import retry_if_transient


@pytest.mark.parametrize("exc", [ConfigError("conf/training/x.yaml: key 'rounds'"),
                                 ValueError("no samples: cannot compute mean and std"),
                                 ResidencyError("site 'us' refuses shard 'eu-000'"), ExchangeError("schema")])
def test_deterministic_failures_are_not_retried(exc: BaseException) -> None:
    assert retry_if_transient(None, None, Failed(data=exc)) is False


@pytest.mark.parametrize("exc", [TimeoutError("rendezvous"), ConnectionError("refused"),
                                 RuntimeError("gloo: connection closed by peer"), OSError("worker lost")])
def test_transient_failures_are_retried(exc: BaseException) -> None:
    assert retry_if_transient(None, None, Failed(data=exc)) is True
