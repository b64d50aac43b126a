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
