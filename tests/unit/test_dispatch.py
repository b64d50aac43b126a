"""A site flow that is not deployed is named, with the fix, before any site run starts (the UI path of the first
hour: `retrain` started from Prefect's UI on a platform where `insitu deploy` never ran for the sites)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from prefect.exceptions import ObjectNotFound

import tasks.dispatch as dispatch


class _NoDeployments:
    def __enter__(self) -> _NoDeployments:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def read_deployment_by_name(self, name: str) -> Any:
        raise ObjectNotFound(None)  # what Prefect's client raises for an unknown deployment


def test_a_missing_site_deployment_says_what_is_missing_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "get_run_logger", lambda: logging.getLogger("test"))
    monkeypatch.setattr(dispatch, "get_client", lambda sync_client: _NoDeployments())
    started: list[str] = []
    monkeypatch.setattr(dispatch, "run_deployment", lambda *a, **k: started.append("run"))
    with pytest.raises(LookupError, match=r"^site-prepare/eu is not deployed: run insitu deploy$"):
        dispatch.start_site_runs("site-prepare", {"eu": {"job_id": "j"}}, {"eu": "insitu-eu"})
    assert started == []


def test_a_quorum_failure_names_why_each_ended_site_run_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from prefect.states import Completed, Failed, Running

    from insitu.federated.rounds import QuorumError

    runs = {"eu": Completed(), "us": Failed(message="AuditServiceError: us's audit service is unreachable"),
            "apac": Running()}
    monkeypatch.setattr(dispatch, "run_states",
                        lambda ids: {s: SimpleNamespace(state=runs[s]) for s in ids})
    ids: dict[str, Any] = dict.fromkeys(runs)
    e = QuorumError("round 1: quorum not met: 2 update(s) from ['eu', 'apac'] < min_sites=3; missing: ['us']")
    reason, error = dispatch.explained(e, ids)
    assert reason == f"{e}; us's site-train run ended Failed: AuditServiceError: us's audit service is unreachable"
    assert isinstance(error, QuorumError) and str(error) == reason  # a completed or running site is not named
    other = RuntimeError("the exchange refused a write")
    assert dispatch.explained(other, ids)[1] is other  # any other error is raised as it is, its reason extended
    monkeypatch.setattr(dispatch, "run_states", lambda ids: (_ for _ in ()).throw(ConnectionError("down")))
    assert dispatch.explained(e, ids) == (str(e), e)  # the orchestrator does not answer: nothing to add
