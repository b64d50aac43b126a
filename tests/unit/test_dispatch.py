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
    assert reason == f"{e}; us's training run ended Failed: AuditServiceError: us's audit service is unreachable"
    assert isinstance(error, QuorumError) and str(error) == reason  # a completed or running site is not named
    other = RuntimeError("the exchange refused a write")
    assert dispatch.explained(other, ids)[1] is other  # any other error is raised as it is, its reason extended
    monkeypatch.setattr(dispatch, "run_states", lambda ids: (_ for _ in ()).throw(ConnectionError("down")))
    assert dispatch.explained(e, ids) == (str(e), e)  # the orchestrator does not answer: nothing to add


# --------------------------------------------------------------------------- one run per site per job
def test_a_phase_goes_to_each_sites_running_run_and_a_new_run_only_where_it_ended(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from prefect.states import Failed, Running

    monkeypatch.setattr(dispatch, "get_run_logger", lambda: logging.getLogger("test"))
    states = {"eu": Running(), "us": Failed(message="worker lost")}
    monkeypatch.setattr(dispatch, "run_states", lambda ids: {s: SimpleNamespace(state=states[s]) for s in ids})
    written: list[tuple[str, dict[str, Any]]] = []
    exchange = SimpleNamespace(put_json=lambda doc, record: written.append((doc.name, record)))
    started: list[tuple[str, list[str], bool]] = []
    monkeypatch.setattr(dispatch, "start_site_runs", lambda flow, params, pools, ex, goes_on: started.append(
        (flow, sorted(params), goes_on)) or {s: f"new-{s}" for s in params})
    eu_run = "0b6f3c1e-7a1d-4c55-9d2e-3f1a2b3c4d5e"
    params = {s: {"job_id": "j", "dataset": "fraud", "training": "fraud", "wait_timeout_s": 900} for s in states}
    ids = dispatch.dispatch_phase("site-train", params, {"eu": eu_run, "us": "ended"}, {}, exchange, goes_on=True)
    assert ids == {"eu": eu_run, "us": "new-us"}
    # eu's running run is dispatched the phase (naming that run); us, whose run ended, gets a new site-train run
    ((name, record),) = written
    assert name == "dispatch-train-eu.json" and record["flow_run_id"] == eu_run and record["goes_on"] is True
    assert started == [("site-train", ["us"], True)]


def test_a_phase_is_done_where_its_run_published_its_result_and_a_completed_state_alone_is_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace
    from uuid import uuid4

    from prefect.states import Completed, Running

    from insitu.federated.paths import EVALUATION

    run_ids = {s: uuid4() for s in ("eu", "us", "apac")}
    # eu's run wrote its result; us's document is an earlier attempt's (another run); apac wrote nothing
    written = {"eu": str(run_ids["eu"]), "us": str(uuid4())}
    from insitu.federated.kinds import ExchangeError

    def get_json(doc: Any, writer: str) -> dict[str, str]:
        if writer not in written:
            raise ExchangeError(f"missing on the exchange: {writer}/{doc.name}")  # as Exchange says it
        return {"flow_run_id": written[writer]}

    exchange = SimpleNamespace(get_json=get_json)
    runs = {s: SimpleNamespace(id=i, state=Completed()) for s, i in run_ids.items()}
    why = "its run ended without publishing evaluate.json"
    assert dispatch.without_result(runs, exchange, EVALUATION) == {"us": why, "apac": why}
    # waiting for a phase's result: a run that published is done with it while it goes on running
    going = {s: SimpleNamespace(id=run_ids[s], state=Running()) for s in ("eu", "us")}
    monkeypatch.setattr(dispatch, "run_states", lambda ids: going)
    seen, published = dispatch.wait_until_published({s: run_ids[s] for s in going}, exchange, EVALUATION,
                                                    timeout=0.2)
    assert published == {"eu"} and seen == going


def test_a_failed_job_tells_waiting_site_runs_to_stop_unless_a_phase_already_did() -> None:
    from types import SimpleNamespace

    marks: list[str] = []
    exchange = SimpleNamespace(exists=lambda doc: bool(marks), put_abort=marks.append)
    with pytest.raises(RuntimeError), dispatch.aborted_on_failure(exchange):
        raise RuntimeError("prepare: quorum not met")
    assert marks == ["RuntimeError: prepare: quorum not met"]
    with pytest.raises(ValueError), dispatch.aborted_on_failure(exchange):
        raise ValueError("later")
    assert marks == ["RuntimeError: prepare: quorum not met"]  # the first reason stands
    with dispatch.aborted_on_failure(exchange):
        pass
    assert len(marks) == 1


# --------------------------------------------------------------------------- stopping a late site's run
class _States:
    """A client that knows each run's state and records what is set."""

    def __init__(self, states: dict[Any, Any]) -> None:
        self.states, self.set = states, {}

    def __enter__(self) -> _States:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def read_flow_run(self, run_id: Any) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(state=self.states[run_id])

    def set_flow_run_state(self, run_id: Any, state: Any, force: bool = False) -> None:
        assert force
        self.set[run_id] = state.type.value


def test_every_run_still_going_is_set_cancelling_never_forced_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run forced Cancelled while its worker holds it (Pending) would be brought back to Running by its process's
    engine (the server lets a Cancelled run run again); Cancelling, the server cancels a Scheduled run without a
    process itself, and the runner does not run one it finds Cancelling. A run that ended is left alone."""
    from prefect.states import Completed, Pending, Running, Scheduled

    client = _States({"scheduled": Scheduled(), "pending": Pending(), "running": Running(), "done": Completed()})
    monkeypatch.setattr(dispatch, "get_client", lambda sync_client: client)
    assert dispatch.cancel_runs({k: k for k in client.states}) == ["scheduled", "pending", "running"]
    assert client.set == {"scheduled": "CANCELLING", "pending": "CANCELLING", "running": "CANCELLING"}
