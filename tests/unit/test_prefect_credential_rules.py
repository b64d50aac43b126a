"""The pure rules behind "the Prefect credential cannot change what a site does": the coordinator's dispatch of a
site run and its check at the site, the shards a site derives, and the detection of a paused pool or a forced
state (the attacks themselves, on the real platform: tests/security/test_prefect_credential.py)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from protocol_examples import store

from insitu.conf import DatasetConfig, load_conf
from insitu.federated.exchange import Exchange
from insitu.federated.kinds import COORDINATOR, ExchangeError
from insitu.federated.paths import dispatch
from insitu.governance.audit import AuditLog, new_key, read_events
from insitu.governance.dispatch import (
    RULE_ONCE,
    RULE_PARAMETERS,
    RULE_TICKET,
    bound_parameters,
    dispatch_record,
    dispatch_refusal,
    once_refusal,
)
from insitu.governance.residency import RULE_ALL_PINNED, ResidencyError, site_shards
from insitu.governance.run_alerts import POOL_PAUSED, RUN_CANCELLED, RUN_FORCED, forced_state, pool_alert, run_alert
from insitu.summary import summary_markdown

REQUEST = {"request": {"principal": "alice"}, "signature": "0" * 128}  # malformed on purpose: digest None
RUN = str(uuid.uuid4())


def _params(**kw: Any) -> dict[str, Any]:
    return {"job_id": "job-7", "dataset": "fraud", "training": "fraud", "overrides": None, "request": None, **kw}


# --------------------------------------------------------------------------- the dispatch, written and checked
def test_a_dispatch_records_the_run_and_its_parameters() -> None:
    rec = dispatch_record("eu", "train", RUN, _params(overrides={"rounds": 2}, wait_timeout_s=900), goes_on=True)
    assert rec == {"recipient": "eu", "phase": "train", "flow_run_id": RUN,
                   "parameters": {"job_id": "job-7", "dataset": "fraud", "training": "fraud",
                                  "overrides": {"rounds": 2}, "request": None, "wait_timeout_s": 900.0},
                   "goes_on": True}  # the run goes on to the job's next phase when the coordinator dispatches it
    assert not dispatch_record("eu", "prepare", RUN, _params())["goes_on"]  # a run dispatched alone ends with it
    assert dispatch_refusal(rec, site="eu", phase="train", flow_run_id=RUN,
                            received=_params(overrides={"rounds": 2}, wait_timeout_s=900.0)) is None


@pytest.mark.parametrize("changed", [{"shards": ["eu-000"]}, {"dataset": "digits"}, {"overrides": {"rounds": 9}},
                                     {"weights": ["round-0003"]}, {"training": "fraud_single"}])
def test_a_parameter_changed_after_the_dispatch_is_refused(changed: dict[str, Any]) -> None:
    rec = dispatch_record("eu", "prepare", RUN, _params())
    rule, why = dispatch_refusal(rec, site="eu", phase="prepare", flow_run_id=RUN, received=_params(**changed))
    name = next(iter(changed))
    assert rule == RULE_PARAMETERS and f"'{name}'" in why and "changed after it was created" in why


@pytest.mark.parametrize("case", ["none", "other-run", "other-phase", "other-site", "no-flow-run"])
def test_a_run_the_coordinator_did_not_dispatch_is_refused(case: str) -> None:
    rec = dispatch_record("eu", "prepare", RUN, _params())
    record: dict[str, Any] | None = rec
    run: str | None = RUN
    if case == "none":
        record = None
    elif case == "other-run":
        run = str(uuid.uuid4())  # a copy of the run, with the very same parameters
    elif case == "other-phase":
        record = {**rec, "phase": "evaluate"}
    elif case == "other-site":
        record = {**rec, "recipient": "us"}
    elif case == "no-flow-run":
        run = None
    rule, why = dispatch_refusal(record, site="eu", phase="prepare", flow_run_id=run, received=_params())
    assert rule == RULE_TICKET and "site 'eu' refuses prepare of job job-7" in why


def test_a_run_is_admitted_once() -> None:
    assert once_refusal(None, site="eu", phase="train", job_id="j", flow_run_id=RUN) is None
    rule, why = once_refusal({"admitted_at": "2026-12-05T08:00:00"}, site="eu", phase="train", job_id="j",
                             flow_run_id=RUN)
    assert rule == RULE_ONCE and RUN in why and "admitted here before" in why


def test_the_dispatch_is_the_coordinators_alone_and_bounded(tmp_path: Path) -> None:
    coord = Exchange(store(tmp_path), "job-7", COORDINATOR)
    rec = dispatch_record("eu", "evaluate", RUN, _params(weights=["round-0002", "champion"]))
    coord.put_json(dispatch("evaluate", "eu"), rec)
    site = Exchange(store(tmp_path), "job-7", "eu")
    assert site.get_json(dispatch("evaluate", "eu"), writer=COORDINATOR) == rec
    with pytest.raises(ExchangeError, match="only the"):  # a site cannot write a dispatch, not even its own
        site.put_json(dispatch("evaluate", "eu"), rec)
    with pytest.raises(ExchangeError):  # no room for anything but the run's parameters
        coord.put_json(dispatch("evaluate", "eu"), {**rec, "parameters": {**rec["parameters"], "rows": [1, 2]}})


def test_bound_parameters_name_the_request_by_its_digest(signed_request: dict[str, Any]) -> None:
    from insitu.governance.request import parse_signed

    bound = bound_parameters(_params(request=signed_request))
    assert bound["request"] == parse_signed(signed_request).digest()
    assert bound_parameters(_params(request=REQUEST))["request"] is None  # malformed: the policy refuses it
    rec = dispatch_record("eu", "prepare", RUN, _params(request=signed_request))
    other = {**signed_request, "signature": "1" * 128}  # another request in the run's parameters
    rule, why = dispatch_refusal(rec, site="eu", phase="prepare", flow_run_id=RUN, received=_params(request=other))
    assert rule == RULE_PARAMETERS and "'request'" in why


@pytest.fixture
def signed_request() -> dict[str, Any]:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from insitu.governance.request import new_request, sign_request

    key = Ed25519PrivateKey.generate()
    return sign_request(new_request("alice", "fraud", "fraud", "a" * 64, "fraud-detection", job_id="job-7"),
                        key).model_dump(mode="json")


# --------------------------------------------------------------------------- the shards a site reads
@pytest.fixture(scope="module")
def dataset(conf_dir: Path) -> DatasetConfig:
    return load_conf("fraud", directory=conf_dir).dataset


def test_a_site_reads_every_shard_pinned_to_it(dataset: DatasetConfig, tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "us.jsonl", new_key(), actor="us")
    assert [s.id for s in site_shards("us", None, "fraud", dataset, audit, "alice", "j", RUN)] == ["us-000", "us-001"]
    same = site_shards("us", ["us-001", "us-000"], "fraud", dataset, audit, "alice", "j", RUN)
    assert [s.id for s in same] == ["us-000", "us-001"]
    assert read_events(audit.path) == []


def test_a_narrowed_shard_list_is_refused_and_audited(dataset: DatasetConfig, tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "us.jsonl", new_key(), actor="us")
    with pytest.raises(ResidencyError, match=RULE_ALL_PINNED) as info:
        site_shards("us", ["us-000"], "fraud", dataset, audit, "alice", "j", RUN)
    assert "every shard its own datasets.yaml pins to it" in str(info.value)
    (event,) = read_events(audit.path)
    assert event["event"] == "residency.refused" and event["fields"]["rule"] == RULE_ALL_PINNED
    assert event["fields"]["shards"] == ["us-000"]


# --------------------------------------------------------------------------- detection
S, P, R, F, C, CG, X = (("SCHEDULED", "Scheduled"), ("PENDING", "Pending"), ("RUNNING", "Running"),
                        ("FAILED", "Failed"), ("COMPLETED", "Completed"), ("CANCELLING", "Cancelling"),
                        ("CANCELLED", "Cancelled"))


@pytest.mark.parametrize("history, published, kind", [
    ([S, P, R, C], False, None),                    # the site's own run
    ([S, P, R, F], False, None),                    # the site's flow failed (its own refusal, an error)
    ([S, P, F], False, None),                       # its worker refused it (audited in the site's log)
    ([S, F], False, RUN_FORCED),                    # set Failed while Scheduled: no worker does that
    ([S, ("SCHEDULED", "Late"), F], False, RUN_FORCED),
    ([S, X], False, RUN_FORCED),
    ([S, P, R, F], True, RUN_FORCED),               # Failed although the site published its result
    ([S, P, R, C, F], False, RUN_FORCED),           # a final state changed again
    ([S, P, R, CG, X], False, RUN_CANCELLED),       # cancelled through the API
    ([S, P, R], False, None),
    ([], False, None),
])
def test_forced_states_are_told_from_the_sites_own(history: list[tuple[str, str]], published: bool,
                                                   kind: str | None) -> None:
    found = forced_state(history, published)
    assert (found[0] if found else None) == kind


def test_alerts_name_the_site_the_phase_and_the_fix() -> None:
    assert pool_alert("eu", "prepare", "insitu-eu", paused=False) is None
    alert = pool_alert("eu", "prepare", "insitu-eu", paused=True, flow_run_id=RUN)
    assert alert is not None and alert.kind == POOL_PAUSED and alert.event == "alert.pool-paused"
    assert "work pool 'insitu-eu' of site 'eu' is paused" in alert.detail and "work-pool resume" in alert.detail
    forced = run_alert("us", "evaluate", RUN, [S, F], published=False)
    assert forced is not None and forced.event == "alert.run-forced" and RUN in forced.detail


def test_the_summary_carries_the_alerts(tmp_path: Path) -> None:
    from insitu.federated.documents.summary import AlertRecord

    alert = pool_alert("eu", "prepare", "insitu-eu", paused=True, flow_run_id=RUN)
    assert alert is not None
    AlertRecord.model_validate(alert.as_record())  # the summary's schema takes what the watch records
    with pytest.raises(ValueError):
        AlertRecord.model_validate({**alert.as_record(), "kind": "anything"})
    from test_summary import SUMMARY

    md = summary_markdown({**SUMMARY, "alerts": [alert.as_record()]})
    assert "**Alerts**" in md and "`pool-paused` eu (prepare)" in md
