"""What the end-to-end (tests/e2e) and security (tests/security) tests do on the running platform, written once:
start a deployment's flow run and wait for it (a site's run as the coordinator dispatches it), read its logs,
cancel a job with its site runs, open a store with its owner's keys, read a job's summary, audit events and MLflow
parent run, write a training config of a test's own.

Plain functions, imported as ``from platform_helpers import …`` (pytest puts ``tests/`` on the path for
``tests/conftest.py``); the fixtures that start the platform are in ``tests/conftest.py``. Prefect's client here
talks to the platform because the ``platform`` fixture points Prefect's settings at it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

import yaml
from mlflow.entities import Run
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName, LogFilter, LogFilterFlowRunId
from prefect.client.schemas.objects import FlowRun
from prefect.states import Cancelling

from deployments.platform import COORDINATOR, Platform
from insitu.federated.publish_delay import PUBLISH_DELAY_FILE
from insitu.governance.audit import read_events
from insitu.storage import Store

RETRAIN = "retrain/coordinator"
EXCHANGE = "insitu-exchange"  # the exchange's bucket in the shipped conf/sites.yaml


# --------------------------------------------------------------------------- flow runs
def start_flow_run(deployment: str, parameters: dict[str, Any] | None = None, **options: Any) -> UUID:
    """Create a run of ``deployment`` (``flow/name``) as the UI's Run button does: without ``parameters`` it runs
    with the deployment's defaults; ``options`` go to ``create_flow_run_from_deployment`` (``job_variables``)."""
    with get_client(sync_client=True) as c:
        dep = c.read_deployment_by_name(deployment)
        return c.create_flow_run_from_deployment(dep.id, parameters=parameters, **options).id


def start_retrain(params: dict[str, Any]) -> UUID:
    """A ``retrain`` run with these ``RetrainParams`` (training, dataset, job_id, request, …)."""
    return start_flow_run(RETRAIN, {"params": params})


def wait_for_flow_runs(flow_run_ids: list[UUID], timeout: float, poll_s: float = 1.0) -> list[FlowRun]:
    """The runs once every one is final, or as they are when ``timeout`` seconds have passed: the caller judges
    each one (so one run that hangs does not hide how the others ended)."""
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as c:
        while True:
            runs = [c.read_flow_run(i) for i in flow_run_ids]
            if all(r.state and r.state.is_final() for r in runs) or time.monotonic() > deadline:
                return runs
            time.sleep(poll_s)


def wait_for_flow_run(flow_run_id: UUID, timeout: float, poll_s: float = 1.0) -> FlowRun:
    """The run once it is final; fails the test when it is not final after ``timeout`` seconds."""
    (run,) = wait_for_flow_runs([flow_run_id], timeout, poll_s)
    assert run.state and run.state.is_final(), f"flow run {run.name} ({run.id}) still {run.state_name} " \
                                               f"after {timeout:.0f}s"
    return run


def run_flow(deployment: str, parameters: dict[str, Any] | None = None, timeout: float = 300,
             poll_s: float = 1.0, **options: Any) -> FlowRun:
    """Start a run of ``deployment`` (see :func:`start_flow_run`) and wait until it is final."""
    return wait_for_flow_run(start_flow_run(deployment, parameters, **options), timeout, poll_s)


def run_dispatched(platform: Platform, deployment: str, parameters: dict[str, Any], timeout: float = 300,
                   poll_s: float = 1.0) -> FlowRun:
    """Start a site flow run as the coordinator does and wait until it is final: create the run, then record its
    dispatch on the exchange with the coordinator's keys (``insitu.governance.dispatch``; a site admits no run the
    coordinator did not dispatch). For tests of what a site does with a run the coordinator sent it."""
    from insitu.federated.exchange import Exchange
    from insitu.federated.paths import dispatch
    from insitu.governance.dispatch import dispatch_record

    flow, site = deployment.split("/")
    phase = flow.removeprefix("site-")
    flow_run_id = start_flow_run(deployment, parameters)
    # The flow's defaults, as the site receives them (the coordinator always passes every parameter).
    received = {"dataset": "fraud", "training": "fraud", "overrides": None, "request": None,
                **({"wait_timeout_s": 900.0} if phase == "train" else {}), **parameters}
    Exchange(coordinator_exchange(platform), parameters["job_id"], writer=COORDINATOR).put_json(
        dispatch(phase, site), dispatch_record(site, phase, str(flow_run_id), received))
    return wait_for_flow_run(flow_run_id, timeout, poll_s)


def flow_runs_named(name: str, exact: bool = False) -> list[FlowRun]:
    """The flow runs whose name contains ``name`` (a job id names all of its site runs), or equals it."""
    match = FlowRunFilterName(any_=[name]) if exact else FlowRunFilterName(like_=name)
    with get_client(sync_client=True) as c:
        return c.read_flow_runs(flow_run_filter=FlowRunFilter(name=match))


def flow_run_logs(flow_run_ids: list[UUID]) -> list[str]:
    """Every log message of these flow runs."""
    with get_client(sync_client=True) as c:
        return [log.message for log in c.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(
            any_=flow_run_ids)))]


def cancel_job(flow_run_id: UUID, job_id: str, timeout: float = 300) -> FlowRun:
    """Cancel a ``retrain`` run and every site run of its job, as the UI's "cancel sub flow runs" does.

    Returns the ``retrain`` run once final, after every site run is final too: no old site run may still be
    alive when a re-run of the job starts.
    """
    with get_client(sync_client=True) as c:
        site_runs = c.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=job_id)))
        for r in [c.read_flow_run(flow_run_id), *site_runs]:
            if not r.state.is_final():
                c.set_flow_run_state(r.id, Cancelling(), force=True)
    cancelled = wait_for_flow_run(flow_run_id, timeout)
    for r in site_runs:
        wait_for_flow_run(r.id, timeout)
    return cancelled


# --------------------------------------------------------------------------- stores and what jobs leave there
def coordinator_exchange(platform: Platform) -> Store:
    """The exchange, opened with the coordinator's keys (it may read every writer's artefacts)."""
    return Store(f"s3://{EXCHANGE}/", platform.storage_options("exchange", COORDINATOR))


def site_store(platform: Platform, site: str) -> Store:
    """A site's own store, opened with that site's own keys."""
    return Store(f"s3://insitu-{site}/", platform.storage_options(site, site))


def wait_for_file(store: Store, path: str, timeout: float, never: str) -> None:
    """Poll ``store`` until ``path`` (a full fsspec path) exists; fail with ``never`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not store.fs.exists(path):
        assert time.monotonic() < deadline, never
        store.fs.invalidate_cache()
        time.sleep(0.2)


def job_summary(platform: Platform, job_id: str) -> dict[str, Any]:
    """The summary the coordinator published on the exchange at the end of ``job_id``."""
    return json.loads(coordinator_exchange(platform).fs.cat(
        f"{EXCHANGE}/jobs/{job_id}/summary/coordinator/summary.json"))


def job_events(platform: Platform, actor: str, job_id: str, *events: str) -> list[dict[str, Any]]:
    """``actor``'s audit events about ``job_id``, oldest first; only those named ``events`` when given."""
    return [e for e in read_events(platform.audit_log(actor))
            if e["fields"].get("job_id") == job_id and (not events or e["event"] in events)]


def parent_run(client: MlflowClient, job_id: str, experiment: str = "insitu-fraud") -> Run:
    """The job's MLflow parent run (each site's run is its child); fails unless there is exactly one."""
    exp = client.get_experiment_by_name(experiment)
    (run,) = [r for r in client.search_runs([exp.experiment_id], f"tags.job_id = '{job_id}'")
              if "mlflow.parentRunId" not in r.data.tags]
    return run


# --------------------------------------------------------------------------- a test's own training configs
def shipped_training(conf_dir: Path, name: str) -> dict[str, Any]:
    """A training config of the platform's ``conf/training/``, as a dict for a test to change."""
    return yaml.safe_load((conf_dir / "training" / f"{name}.yaml").read_text())


def e2e_name(tag: str) -> str:
    """A fresh name for a test's own config, job or model: ``e2e-<tag>-<6 hex>`` (git ignores ``e2e-*.yaml``)."""
    return f"e2e-{tag}-{uuid.uuid4().hex[:6]}"


WRITTEN: list[Path] = []  # every config write_training wrote in this process (shared_conf removes a test's own)


def write_training(directory: Path, name: str, cfg: dict[str, Any]) -> Path:
    """``cfg`` written as ``<directory>/<name>.yaml``: a run may name only configs of the platform's
    ``conf/training/`` (the ``shared_conf`` fixture), so that is where ``directory`` is."""
    path = directory / f"{name}.yaml"
    part = directory / f".{name}.yaml.part"  # renamed into place whole: a test beside this one (make test's other
    part.write_text(yaml.safe_dump(cfg))    # stream) may list and read the directory at any moment
    part.replace(path)
    WRITTEN.append(path)
    return path


@contextmanager
def slow_sites(platform: Platform, job_id: str, delays: dict[str, float]) -> Iterator[None]:
    """Make sites deliberately slow for one job, as each site's own operator would: ``publish-delay.json`` beside
    the site's identity file (its admin's directory), read by the site itself (``insitu.federated.publish_delay``)."""
    files = {site: platform.identity_file(site).parent / PUBLISH_DELAY_FILE for site in delays}
    for site, path in files.items():
        entries = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps({**entries, job_id: delays[site]}))
        path.chmod(0o644)  # written by the test (root); read by the site's own user
    try:
        yield
    finally:
        for path in files.values():
            entries = json.loads(path.read_text()) if path.exists() else {}
            entries.pop(job_id, None)
            path.write_text(json.dumps(entries))


def assert_logged_once(platform: Platform, job_id: str, rounds: int, model: str,
                       experiment: str = "insitu-fraud") -> Run:
    """What a job leaves in MLflow however many attempts it took: one version of ``model`` registered, for this
    job, from its one parent run; one child run per site, each round's ``train_loss`` logged once. Returns the
    parent."""
    client = MlflowClient(platform.mlflow_url)
    versions = client.search_model_versions(f"name = '{model}'")
    assert [v.tags.get("job_id") for v in versions] == [job_id], [v.tags.get("job_id") for v in versions]
    tagged = client.search_runs([client.get_experiment_by_name(experiment).experiment_id], f"tags.job_id = '{job_id}'")
    parents = [r for r in tagged if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1, "a re-run must continue the job's MLflow run, not start another"
    assert versions[0].run_id == parents[0].info.run_id
    children = [r for r in tagged if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert {r.data.tags["site"] for r in children} == set(platform.sites.names)
    for r in children:
        assert [m.step for m in client.get_metric_history(r.info.run_id, "train_loss")] == list(range(rounds))
    return parents[0]


def assert_trail_verifies(platform: Platform) -> list[Any]:
    """Every actor's audit log verifies against the anchors the exchange keeps; returns the results."""
    from insitu.governance.anchors import list_anchors
    from insitu.governance.trail import verify_trail

    found = list_anchors(coordinator_exchange(platform), platform.audit_service_keys())
    results = verify_trail({a: (platform.audit_log(a), platform.audit_key(a)) for a in platform.actors}, found)
    assert all(r.ok for r in results), [(r.actor, r.reason) for r in results]
    return results
