"""End to end on the real platform: retrain triggered through the Prefect API, as the UI does."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from mlflow.tracking import MlflowClient
from platform_helpers import (
    EXCHANGE,
    RETRAIN,
    coordinator_exchange,
    flow_run_logs,
    flow_runs_named,
    job_events,
    job_summary,
    run_dispatched,
    site_store,
    start_flow_run,
    wait_for_flow_run,
)
from prefect.client.orchestration import get_client

from deployments.platform import Platform
from deployments.runner import FORKED
from insitu.governance.audit import read_events, verify

pytestmark = pytest.mark.e2e
ROW_ID = re.compile(rb"(eu|us|apac)-\d{3}-\d{8}")


@pytest.fixture(scope="module")
def job(deployed: Platform) -> dict[str, Any]:
    """A run created from the deployment with its default parameters (those of the demo's weekly schedule)."""
    fr = wait_for_flow_run(start_flow_run(RETRAIN), 1500, poll_s=2)  # no parameters: the deployment's defaults
    jobs = [p.rsplit("/", 1)[-1] for p in coordinator_exchange(deployed).fs.ls(f"{EXCHANGE}/jobs")]
    (job_id,) = [j for j in jobs if not j.startswith(("e2e-", "ui-"))]
    return {"flow_run": fr, "job_id": job_id, "rounds": 5}


def test_the_schedule_of_datasets_yaml_is_deployed_with_its_parameters(deployed: Platform) -> None:
    with get_client(sync_client=True) as c:
        dep = c.read_deployment_by_name(RETRAIN)
    (sched,) = dep.schedules  # conf/datasets.yaml: fraud, weekly
    assert sched.active and sched.schedule.cron == "0 3 * * 1" and sched.schedule.timezone == "Europe/Berlin"
    assert sched.parameters == {"params": {"dataset": "fraud", "training": "fraud"}}
    assert dep.parameters == {"params": {"training": "fraud", "dataset": "fraud"}}


def test_retrain_completes(job: dict[str, Any]) -> None:
    fr = job["flow_run"]
    assert fr.state.is_completed(), fr.state.message
    assert any(FORKED in m for m in flow_run_logs([fr.id])), "the coordinator's run was not a warm start"


def test_site_runs_ran_on_their_own_site_workers(deployed: Platform, job: dict[str, Any]) -> None:
    by_name = {r.name: r for r in flow_runs_named(job["job_id"])}
    # One flow run per site per job: its prepare run trains and evaluates too (one process start, not three).
    assert sorted(by_name) == sorted(f"site-prepare-{s}-{job['job_id']}" for s in ("eu", "us", "apac")), by_name
    for site in ("eu", "us", "apac"):
        r = by_name[f"site-prepare-{site}-{job['job_id']}"]
        assert r.state.is_completed(), (r.name, r.state.message)
        assert r.work_pool_name == f"insitu-{site}"
        logs = flow_run_logs([r.id])
        assert any(f"Worker 'insitu-{site}-worker' submitting" in m for m in logs), logs[:5]
        # a warm start: forked from the site worker's fork server, not a new Python importing everything again
        assert any(FORKED in m for m in logs), logs[:8]
        # the site's own identity, and its own policy's decision on the request the job carried
        assert any(f"site={site} pool=insitu-{site}" in m and f"site '{site}' admits" in m
                   and "for 'alice'" in m for m in logs), logs
        # each later phase admitted in the same run as a run of its own would be: the site's policy, the dispatch
        decided = {(e["fields"]["action"], e["fields"]["flow_run_id"], e["fields"]["allowed"])
                   for e in job_events(deployed, site, job["job_id"], "policy.decision")}
        for phase in ("train", "evaluate"):
            assert any(f"goes on to {phase}: site '{site}' admits {phase}" in m for m in logs), logs
            assert (phase, str(r.id), True) in decided, decided


def test_model_registered_with_challenger_alias_and_metrics(deployed: Platform, job: dict[str, Any]) -> None:
    client = MlflowClient(deployed.mlflow_url)
    mv = client.get_model_version_by_alias("insitu-fraud", "challenger")
    assert mv.tags["job_id"] == job["job_id"]
    # the first model ever becomes champion when it meets the absolute floor
    assert mv.tags["gate"] == "passed", mv.tags.get("gate_reason")
    assert client.get_model_version_by_alias("insitu-fraud", "champion").version == mv.version
    assert set(mv.tags["sites"].split(",")) == {"eu", "us", "apac"}
    assert mv.tags["config_hash"]
    assert re.fullmatch(r"[0-9a-f]{12}", mv.tags["code_version"]), mv.tags["code_version"]  # read as the coordinator
    run = client.get_run(mv.run_id)
    assert 0.5 < run.data.metrics["global_test_roc_auc"] <= 1.0
    for site in ("eu", "us", "apac"):
        assert f"{site}_test_pr_auc" in run.data.metrics
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert {"plots/pr_curve.png", "plots/site_metrics.png"} <= artifacts
    # A site with too few test rows of a class publishes no histogram; the run says which (the e2e data is small).
    left_out = set(filter(None, run.data.tags.get("pr_curve_withheld", "").split(",")))
    assert left_out <= {"eu", "us", "apac"}
    summary = job_summary(deployed, job["job_id"])
    assert set(summary["withheld"].get("PR curve", [])) == left_out  # the summary names them too
    assert run.data.params["strategy"] == "ddp" and run.data.params["ranks_per_site"] == "2"
    assert any(k.startswith("system/") for k in run.data.metrics), sorted(run.data.metrics)
    children = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'")
    assert {c.data.tags["site"] for c in children} == {"eu", "us", "apac"}
    for c in children:
        hist = client.get_metric_history(c.info.run_id, "train_loss")
        assert [m.step for m in hist] == list(range(job["rounds"]))
        # every global model (0 … rounds) validated on the site's own validation split, as a step series
        val = client.get_metric_history(c.info.run_id, "val_pr_auc")
        assert [m.step for m in val] == list(range(job["rounds"] + 1))


def test_the_best_round_by_validation_is_registered(deployed: Platform, job: dict[str, Any]) -> None:
    """Each round's global model is validated by the sites; the registered one is the best by the validation
    metric, and the version, the parent run, the summary and the audit log say which and why."""
    client = MlflowClient(deployed.mlflow_url)
    mv = client.get_model_version_by_alias("insitu-fraud", "challenger")
    run = client.get_run(mv.run_id)
    series = {int(m.step): m.value for m in client.get_metric_history(run.info.run_id, "global_val_pr_auc")}
    assert sorted(series) == list(range(job["rounds"] + 1))
    best = max(series, key=lambda r: (series[r], -r))  # the earlier of equals
    summary = job_summary(deployed, job["job_id"])
    assert summary["selected_round"] == best == int(mv.tags["selected_round"]) == int(run.data.tags["selected_round"])
    assert [v["round"] for v in summary["validation"]] == list(range(job["rounds"] + 1))
    assert "best round by validation pr_auc" in mv.tags["selection"]
    (selected,) = job_events(deployed, "coordinator", job["job_id"], "job.selected")
    assert selected["fields"]["round"] == best and selected["fields"]["stopped_early"] is False
    # the registered weights are that round's global model
    from insitu.federated.exchange import state_from_bytes

    raw = coordinator_exchange(deployed).fs.cat(
        f"{EXCHANGE}/jobs/{job['job_id']}/weights/coordinator/round-{best:04d}.pt")
    with_tags = client.download_artifacts(mv.run_id, "weights/state.pt")
    registered = state_from_bytes(Path(with_tags).read_bytes())
    exchanged = state_from_bytes(raw)
    assert all(torch.equal(registered[k], exchanged[k]) for k in exchanged)


def test_a_site_scores_one_model_per_job(deployed: Platform, job: dict[str, Any], signer: Any) -> None:
    """A coordinator may not use a site's test rows as an oracle: after the job's evaluation, asking eu to
    score another round of the same job is refused with its rule, and audited."""
    summary = job_summary(deployed, job["job_id"])
    other = (summary["selected_round"] + 1) % (job["rounds"] + 1)
    fr = run_dispatched(deployed, "site-evaluate/eu", {"job_id": job["job_id"], "weights": [f"round-{other:04d}"],
                                                       "request": signer(job_id=job["job_id"])}, 300, poll_s=2)
    assert fr.state.is_failed() and "rule evaluate.one-selected-round" in fr.state.message, fr.state.message
    assert f"bound to round-{summary['selected_round']:04d}" in fr.state.message
    refused = job_events(deployed, "eu", job["job_id"], "evaluate.refused")
    assert refused and refused[-1]["fields"]["rule"] == "evaluate.one-selected-round"


def test_audit_logs_verify_and_record_every_read(deployed: Platform, job: dict[str, Any]) -> None:
    for actor in ("coordinator", "eu", "us", "apac"):
        r = verify(deployed.audit_log(actor), deployed.audit_key(actor))
        assert r.ok, (actor, r.reason)
    for site, shards in {"eu": ["eu-000", "eu-001"], "us": ["us-000", "us-001"],
                         "apac": ["apac-000", "apac-001", "apac-002"]}.items():
        reads = job_events(deployed, site, job["job_id"], "data.read")
        assert {e["fields"].get("shard") for e in reads} >= set(shards)
        assert all(e["fields"]["flow_run_id"] for e in reads)
    events = [e["event"] for e in read_events(deployed.audit_log("coordinator"))]
    assert "model.registered" in events and "model.gate" in events
    # The coordinator countersigned each site's newest anchor, one its audit service signed (anchor_id set).
    countersigned = [e["fields"] for e in read_events(deployed.audit_log("coordinator"))
                     if e["event"] == "audit.anchor" and e["fields"].get("job_id") == job["job_id"]]
    assert {f["anchored_actor"] for f in countersigned} == {"eu", "us", "apac"}
    assert all(len(f["anchor_id"]) == 64 for f in countersigned)


def test_exchange_holds_no_row_level_data(deployed: Platform, job: dict[str, Any]) -> None:
    fs = coordinator_exchange(deployed).fs
    files = fs.find(f"{EXCHANGE}/jobs/{job['job_id']}/")
    assert files
    kinds = set()
    for f in files:
        data = fs.cat(f)
        assert not f.endswith((".parquet", ".csv")), f
        assert not data.startswith(b"PAR1"), f
        assert not ROW_ID.search(data), f"row id found in {f}"
        kinds.add(f.split("/")[3])
    assert kinds <= {"plan", "stats", "weights", "update", "metrics", "summary", "control"}
    summary = job_summary(deployed, job["job_id"])
    # Byte accounting: the reported bytes are exactly what lies on the exchange for this job.
    assert summary["bytes_crossed"] == sum(fs.size(f) for f in files if "/summary/" not in f)
    assert set(summary["bytes_crossed_by_writer"]) == {"coordinator", "eu", "us", "apac"}
    # Each step names the identity it ran as: the site's own OS user and pool, from its own identity file.
    for actor in ("coordinator", "eu", "us", "apac"):
        for step, who in summary["ran_as"][actor].items():
            assert who["actor"] == actor and who["pool"] == f"insitu-{actor}", (actor, step, who)
            assert who["os_user"] == deployed.account(actor).name, (actor, step, who)
    assert set(summary["ran_as"]["eu"]) == {"prepare", "train", "evaluate"}


def test_quarantine_holds_bad_rows_with_reasons(deployed: Platform, job: dict[str, Any]) -> None:
    seeded = deployed.state["seeded"]
    for site in ("eu", "us", "apac"):
        fs = site_store(deployed, site).fs
        q = f"insitu-{site}/quarantine/fraud/{job['job_id']}"
        bad = pd.read_parquet(f"s3://{q}/{site}-000.parquet", storage_options={
            "key": fs.key, "secret": fs.secret, "client_kwargs": {"endpoint_url": deployed.s3_endpoint(site)}})
        assert len(bad) == seeded[f"{site}-000"]["malformed"]
        assert bad["_quarantine_reason"].str.len().gt(0).all()
    fs = site_store(deployed, "apac").fs
    q = f"insitu-apac/quarantine/fraud/{job['job_id']}"
    assert fs.exists(f"{q}/apac-002.unreadable")
    reason = json.loads(fs.cat(f"{q}/apac-002.reason.json"))
    assert "unreadable" in reason["error"]


def test_retrain_deployment_exposes_a_validated_parameter_form(deployed: Platform) -> None:
    with get_client(sync_client=True) as c:
        dep = c.read_deployment_by_name(RETRAIN)
        schema = dep.parameter_openapi_schema
        props = schema["definitions"]["RetrainParams"]["properties"]
        assert {"training", "dataset", "job_id", "rounds", "local_epochs", "batch_size"} <= set(props)
        assert props["rounds"]["anyOf"][0]["minimum"] == 1
        with pytest.raises(Exception, match="(?i)validation|409|parameters"):
            c.create_flow_run_from_deployment(dep.id, parameters={"params": {"rounds": 0}})


def test_a_one_row_test_split_publishes_no_metric(deployed: Platform, job: dict[str, Any], signer: Any) -> None:
    """eu's test split of the finished job is cut to one row; scoring it again publishes nothing about that row
    (no loss, no positive rate, no histogram), only that it was withheld. Runs last: it rewrites eu's results."""
    import io

    from insitu.data.loader import split_files
    from insitu.federated.rounds import round_name

    store = site_store(deployed, "eu")
    files = split_files(store, "fraud", job["job_id"], "test")
    saved = {f: store.fs.cat(f) for f in files}
    first = pd.read_parquet(io.BytesIO(saved[files[0]]))
    try:
        for i, f in enumerate(files):
            buf = io.BytesIO()
            (first.head(1) if i == 0 else first.head(0)).to_parquet(buf)
            store.fs.pipe(f, buf.getvalue())
        summary = job_summary(deployed, job["job_id"])
        final = round_name(summary["selected_round"])  # the one model eu scores for this job
        fr = run_dispatched(deployed, "site-evaluate/eu", {"job_id": job["job_id"], "weights": [final],
                                                           "request": signer(job_id=job["job_id"])}, 300, poll_s=2)
        assert fr.state.is_completed(), fr.state.message
        published = json.loads(coordinator_exchange(deployed).fs.cat(
            f"{EXCHANGE}/jobs/{job['job_id']}/metrics/eu/evaluate.json"))
        assert published["models"][final] == {"withheld": "fewer than 20 rows"}, published["models"][final]
    finally:
        for f, data in saved.items():
            store.fs.pipe(f, data)
