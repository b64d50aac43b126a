"""The one Prefect API credential, used as an insider would: every site's worker holds it.

With it, an attacker rewrites a scheduled site run's parameters (``PATCH /flow_runs/{id}``), copies the signed
request out of a job's runs and replays it for the same job and phase with a narrowed shard list (or an exact copy,
or the very same run forced back to Scheduled), replays it for another dataset, pauses site pools and forces a
site's run Failed. Each site refuses what its coordinator did not dispatch (``insitu.governance.dispatch``), with
the rule, in its own audit log; the coordinator names the paused pools and the forced run in the job's summary,
audits them as ``alert.*`` and emits them as Prefect events.

One job (a test config: 1 round, quorum 1) is attacked while it runs: us's and apac's pools are paused before it
starts, us's scheduled prepare run gets a narrowed ``shards`` parameter, apac's is forced Failed; eu alone trains.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest
from platform_helpers import (
    e2e_name,
    flow_runs_named,
    job_events,
    job_summary,
    shipped_training,
    start_flow_run,
    start_retrain,
    wait_for_flow_run,
    wait_for_flow_runs,
    write_training,
)
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolUpdate
from prefect.client.schemas.objects import FlowRun
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from prefect.states import Failed, Scheduled

from deployments.platform import Platform
from insitu.governance.audit import verify
from insitu.governance.request import parse_signed

pytestmark = pytest.mark.e2e
PAUSED = ("us", "apac")


def _pause(site: str, paused: bool) -> None:
    with get_client(sync_client=True) as c:
        c.update_work_pool(f"insitu-{site}", WorkPoolUpdate(is_paused=paused))


def _run_named(name: str, timeout: float) -> FlowRun:
    deadline = time.monotonic() + timeout
    while not (runs := flow_runs_named(name, exact=True)):
        assert time.monotonic() < deadline, f"no flow run {name} after {timeout:.0f}s"
        time.sleep(1)
    (run,) = runs
    return run


def _events(p: Platform, actor: str, job_id: str, event: str, n: int, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while len(found := job_events(p, actor, job_id, event)) < n:
        assert time.monotonic() < deadline, f"{actor} audited {len(found)} {event} for {job_id}, not {n}"
        time.sleep(1)
    return found


@pytest.fixture(scope="module")
def attacked(deployed: Platform, signer: Any) -> Iterator[dict[str, Any]]:
    name = e2e_name("cred")
    cfg = shipped_training(deployed.conf_dir, "fraud_single")
    cfg["rounds"] = 1
    cfg["federation"]["min_sites"] = 1  # eu alone may finish the job the attacker stalls
    path = write_training(deployed.conf_dir / "training", name, cfg)
    path.chmod(0o644)
    job_id = e2e_name("cred-job")
    for site in PAUSED:
        _pause(site, True)
    try:
        retrain = start_retrain({"training": name, "dataset": "fraud", "job_id": job_id, "phase_timeout_s": 600,
                                 "request": signer(name, job_id=job_id)})
        us = _run_named(f"site-prepare-us-{job_id}", 300)
        apac = _run_named(f"site-prepare-apac-{job_id}", 300)
        # (a) The attacker narrows us's scheduled run to one of its two shards.
        with get_client(sync_client=True) as c:
            c.update_flow_run(us.id, parameters={**us.parameters, "shards": ["us-000"]})
        _events(deployed, "coordinator", job_id, "alert.pool-paused", 2, 120)
        _pause("us", False)
        us_prepare = wait_for_flow_run(us.id, 300)
        # (d) ... and forces apac's run Failed while it waits on the paused pool.
        with get_client(sync_client=True) as c:
            c.set_flow_run_state(apac.id, Failed(message="worker lost"), force=True)
        _pause("apac", False)
        done = wait_for_flow_run(retrain, 900, poll_s=2)
        yield {"job_id": job_id, "training": name, "retrain": done, "us_prepare": us_prepare, "apac_prepare": apac}
    finally:
        for site in PAUSED:
            _pause(site, False)
        path.unlink(missing_ok=True)


def test_a_patched_scheduled_run_is_refused_by_its_site(deployed: Platform, attacked: dict[str, Any]) -> None:
    fr, job_id = attacked["us_prepare"], attacked["job_id"]
    assert fr.state.is_failed(), fr.state
    assert "rule dispatch.parameters" in fr.state.message and "['shards']" in fr.state.message, fr.state.message
    (refused,) = job_events(deployed, "us", job_id, "dispatch.refused")
    assert refused["fields"]["rule"] == "dispatch.parameters" and refused["fields"]["principal"] == "alice"
    assert refused["fields"]["flow_run_id"] == str(fr.id)
    assert not job_events(deployed, "us", job_id, "data.read")  # us read nothing for the changed run
    assert verify(deployed.audit_log("us"), deployed.audit_key("us")).ok
    # The job went on without us, and says so.
    assert attacked["retrain"].state.is_completed(), attacked["retrain"].state.message
    assert set(job_summary(deployed, job_id)["sites"]) == {"eu"}


def test_a_paused_pool_and_a_forced_run_are_named_audited_and_alerted(deployed: Platform,
                                                                      attacked: dict[str, Any]) -> None:
    job_id, apac = attacked["job_id"], attacked["apac_prepare"]
    alerts = job_summary(deployed, job_id)["alerts"]
    assert {(a["kind"], a["site"], a["phase"]) for a in alerts} >= {
        ("pool-paused", "us", "prepare"), ("pool-paused", "apac", "prepare"), ("run-forced", "apac", "prepare")}
    (forced,) = [a for a in alerts if a["kind"] == "run-forced"]
    assert forced["flow_run_id"] == str(apac.id) and "before the site's worker took it" in forced["detail"]
    paused = job_events(deployed, "coordinator", job_id, "alert.pool-paused")
    assert {e["fields"]["pool"] for e in paused} == {"insitu-us", "insitu-apac"}
    (audited,) = job_events(deployed, "coordinator", job_id, "alert.run-forced")
    assert audited["fields"]["site_flow_run_id"] == str(apac.id)
    # Emitted as Prefect events, for an automation to act on.
    with get_client(sync_client=True) as c:
        page = c.read_events(EventFilter(event=EventNameFilter(prefix=["insitu.alert."]),
                                         resource=EventResourceFilter(id=[f"insitu.job.{job_id}"])), limit=50)
    mine = {e.event for e in page.events}
    assert mine >= {"insitu.alert.pool-paused", "insitu.alert.run-forced"}, mine
    assert verify(deployed.audit_log("coordinator"), deployed.audit_key("coordinator")).ok


def test_a_copied_request_replayed_for_the_same_job_and_phase_is_refused(deployed: Platform,
                                                                         attacked: dict[str, Any]) -> None:
    """The request copied from the retrain run's parameters, replayed for eu's prepare of the same job: with a
    narrowed shard list, as an exact copy, and as eu's own completed run forced back to Scheduled."""
    job_id = attacked["job_id"]
    with get_client(sync_client=True) as c:
        request = c.read_flow_run(attacked["retrain"].id).parameters["params"]["request"]
    eu = _run_named(f"site-prepare-eu-{job_id}", 10)
    assert eu.state.is_completed(), eu.state
    reads = len(job_events(deployed, "eu", job_id, "data.read"))
    copied = {**eu.parameters, "request": request}
    narrowed = start_flow_run("site-prepare/eu", {**copied, "shards": ["eu-000"]})
    same = start_flow_run("site-prepare/eu", copied)
    with get_client(sync_client=True) as c:
        c.set_flow_run_state(eu.id, Scheduled(), force=True)
    runs = {r.id: r for r in wait_for_flow_runs([narrowed, same, eu.id], 300)}
    expected: dict[UUID, str] = {narrowed: "dispatch.ticket", same: "dispatch.ticket", eu.id: "dispatch.run-once"}
    for run_id, rule in expected.items():
        fr = runs[run_id]
        assert fr.state.is_failed() and f"rule {rule}" in fr.state.message, (rule, fr.state)
    refused = {e["fields"]["flow_run_id"]: e["fields"] for e in job_events(deployed, "eu", job_id, "dispatch.refused")}
    assert {refused[str(i)]["rule"] for i in expected} == set(expected.values())
    assert all(refused[str(i)]["rule"] == rule and refused[str(i)]["request"] == parse_signed(request).digest()
               for i, rule in expected.items())
    assert len(job_events(deployed, "eu", job_id, "data.read")) == reads  # nothing read again
    assert verify(deployed.audit_log("eu"), deployed.audit_key("eu")).ok


@pytest.mark.parametrize("dataset, rule, event", [("e2e-not-here", "request.config", "run.refused"),
                                                  ("digits", "request.dataset", "policy.decision")])
def test_a_request_replayed_for_another_dataset_is_refused_and_audited(deployed: Platform, attacked: dict[str, Any],
                                                                       dataset: str, rule: str, event: str) -> None:
    job_id = attacked["job_id"]
    with get_client(sync_client=True) as c:
        request = c.read_flow_run(attacked["retrain"].id).parameters["params"]["request"]
    before = len(job_events(deployed, "eu", job_id, event))
    fr = wait_for_flow_run(start_flow_run("site-prepare/eu", {"job_id": job_id, "dataset": dataset,
                                                              "training": attacked["training"], "request": request}),
                           300)
    assert fr.state.is_failed() and f"rule {rule}" in fr.state.message, fr.state
    new = job_events(deployed, "eu", job_id, event)[before:]
    (refusal,) = [e["fields"] for e in new if e["fields"]["flow_run_id"] == str(fr.id)]
    assert refusal["rule"] == rule and refusal.get("allowed", False) is False
    assert refusal["request"] == parse_signed(request).digest()
