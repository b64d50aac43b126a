"""Attacks on the running platform, as someone who can reach its APIs would try them; each boundary refuses.

The site worker (job variables, foreign deployments and pull steps, an edited pool template), storage
(IAM per site and per exchange writer), the Prefect API, MLflow's registry and each site's Dask
scheduler. Refusals that concern a site are found in that site's own audit log.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import s3fs
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from platform_helpers import run_dispatched, run_flow, wait_for_flow_run
from prefect.client.orchestration import get_client

from deployments.platform import COORDINATOR, Platform
from deployments.platform.pools import ensure_locked_pool
from deployments.worker import RULE_ENTRYPOINT, RULE_JOB_VARIABLES, RULE_PULL_STEPS
from insitu.governance.audit import read_events, verify

pytestmark = pytest.mark.e2e


def _new_events(platform: Platform, actor: str, before: int) -> list[dict[str, Any]]:
    return read_events(platform.audit_log(actor))[before:]


@pytest.mark.parametrize("job_variables", [
    # Forge the site's identity: tell the us worker it is eu, and read an eu shard on us's cluster.
    {"env": {"INSITU_IDENTITY": "/tmp/forged-identity.json", "PREFECT__RUNTIME__DEPLOYMENT__ID": "x"}},
    # Run arbitrary code in the worker's environment (every key it holds).
    {"command": "sh -c 'cat /proc/self/environ > /tmp/insitu-stolen'"},
    {"working_dir": "/tmp"},
])
def test_a_run_with_job_variables_is_refused_before_anything_starts(deployed: Platform,
                                                                     job_variables: dict[str, Any]) -> None:
    before = len(read_events(deployed.audit_log("us")))
    fr = run_flow("site-prepare/us", {"job_id": "e2e-attack-jv", "shards": ["eu-000"]}, job_variables=job_variables)
    assert fr.state.is_failed(), fr.state
    assert "refused by site 'us'" in fr.state.message and RULE_JOB_VARIABLES in fr.state.message
    assert fr.infrastructure_pid is None  # no process was started
    assert not Path("/tmp/insitu-stolen").exists()
    new = _new_events(deployed, "us", before)
    (refusal,) = [e for e in new if e["event"] == "run.refused"]
    assert refusal["fields"]["rule"] == RULE_JOB_VARIABLES and refusal["fields"]["flow_run_id"] == str(fr.id)
    assert not [e for e in new if e["event"] == "data.read"]
    assert verify(deployed.audit_log("us"), deployed.audit_key("us")).ok


@pytest.mark.parametrize(("entrypoint", "pull_steps", "rule"), [
    ("/tmp/evil.py:evil", None, RULE_ENTRYPOINT),
    ("flows/site_prepare.py:site_prepare",
     [{"prefect.deployments.steps.run_shell_script": {"script": "touch /tmp/insitu-pwned"}}], RULE_PULL_STEPS),
])
def test_a_deployment_someone_else_registered_on_a_site_pool_does_not_run(
        deployed: Platform, entrypoint: str, pull_steps: list[dict[str, Any]] | None, rule: str) -> None:
    before = len(read_events(deployed.audit_log("eu")))
    with get_client(sync_client=True) as client:
        flow_id = client.read_deployment_by_name("site-prepare/eu").flow_id
        dep_id = client.create_deployment(flow_id, f"evil-{uuid.uuid4().hex[:6]}", work_pool_name="insitu-eu",
                                          entrypoint=entrypoint, pull_steps=pull_steps, path=".")
        fr = client.create_flow_run_from_deployment(dep_id, parameters={"job_id": "e2e-attack-dep"})
    fr = wait_for_flow_run(fr.id, 300)
    assert fr.state.is_failed() and rule in fr.state.message, fr.state
    assert not Path("/tmp/insitu-pwned").exists()
    (refusal,) = [e for e in _new_events(deployed, "eu", before) if e["event"] == "run.refused"]
    assert refusal["fields"]["rule"] == rule


def test_an_edited_pool_template_changes_nothing_and_the_guard_still_refuses(deployed: Platform,
                                                                            signer: Any) -> None:
    """The pool's template on the server is rewritten to run a command; the worker runs its own locked one,
    whose flow then refuses the foreign shard (and audits it)."""
    marker = Path(f"/tmp/insitu-template-{uuid.uuid4().hex[:6]}")
    headers = deployed._prefect_headers()
    evil = {"job_configuration": {"command": f"touch {marker}", "env": {}, "working_dir": "/tmp"},
            "variables": {"type": "object", "properties": {}}}
    worker_log = deployed.dir / "logs" / "worker-insitu-us.log"
    noticed = worker_log.read_text().count("differs from the locked one")
    for _ in range(5):  # the server's SQLite answers 503 now and then under CI load: an attacker retries too
        r = httpx.patch(f"{deployed.prefect_api_url}/work_pools/insitu-us", json={"base_job_template": evil},
                        headers=headers, timeout=30)
        if r.status_code < 500:
            break
        time.sleep(2)
    assert r.status_code == 204, r.text
    try:
        before = len(read_events(deployed.audit_log("us")))
        # As if the coordinator itself sent it (dispatched): the site's own guard is what refuses the shard.
        fr = run_dispatched(deployed, "site-prepare/us", {"job_id": "e2e-attack-template", "shards": ["eu-000"],
                                                          "request": signer(job_id="e2e-attack-template")})
        assert fr.state.is_failed() and "site 'us' refuses to read shard 'eu-000'" in fr.state.message, fr.state
        assert not marker.exists()
        # The worker read the edited template while vetting this very run, and ran its locked one.
        assert worker_log.read_text().count("differs from the locked one") > noticed
        assert "pinned to site 'eu'" in fr.state.message
        new = _new_events(deployed, "us", before)
        (refused,) = [e for e in new if e["event"] == "residency.refused"]
        f = refused["fields"]
        assert (f["shard"], f["principal"], f["pinned_to"], f["job_id"]) == ("eu-000", "alice", "eu",
                                                                             "e2e-attack-template")
        assert f["rule"] == "residency.shard-pinned-to-site"
        assert not any(e["event"] == "data.read" for e in new)
        assert verify(deployed.audit_log("us"), deployed.audit_key("us")).ok
    finally:
        ensure_locked_pool(deployed.prefect_api_url, headers, "insitu-us")


def test_a_run_may_not_point_a_site_at_a_file_of_its_choosing(deployed: Platform) -> None:
    """The training parameter names a config; a path to anything else (here the site's own identity file,
    which holds its audit key) is refused without reading or echoing it."""
    secret = str(deployed.identity_file("us"))
    fr = run_flow("site-prepare/us", {"job_id": "e2e-attack-conf", "training": secret})
    assert fr.state.is_failed() and "only configs in" in fr.state.message, fr.state
    assert deployed.audit_key("us").hex() not in fr.state.message


def test_storage_gives_each_credential_only_what_its_holder_may(deployed: Platform) -> None:
    eu_key, eu_secret = deployed.s3_credentials("eu", "eu")
    # eu's key means nothing on us's store (another account), and a wrong secret on its own store fails.
    us_fs = s3fs.S3FileSystem(key=eu_key, secret=eu_secret, skip_instance_cache=True,
                              client_kwargs={"endpoint_url": deployed.s3_endpoint("us")})
    with pytest.raises(PermissionError):
        us_fs.ls("insitu-us")
    bad = s3fs.S3FileSystem(key=eu_key, secret="wrong" * 8, skip_instance_cache=True,
                            client_kwargs={"endpoint_url": deployed.s3_endpoint("eu")})
    with pytest.raises(PermissionError):
        bad.ls("insitu-eu")
    assert s3fs.S3FileSystem(**deployed.storage_options("eu", "eu")).ls("insitu-eu") is not None
    # On the exchange eu writes only under its own prefix and reads no other site's artefacts.
    ex = s3fs.S3FileSystem(**deployed.storage_options("exchange", "eu"))
    ex.pipe("insitu-exchange/jobs/e2e-attack/update/eu/x.json", b"{}")
    for key in ("jobs/e2e-attack/update/us/x.json", "jobs/e2e-attack/weights/coordinator/round-0001.pt"):
        with pytest.raises(PermissionError):
            ex.pipe(f"insitu-exchange/{key}", b"{}")
    s3fs.S3FileSystem(**deployed.storage_options("exchange", "us")).pipe(
        "insitu-exchange/jobs/e2e-attack/update/us/y.json", b"{}")
    with pytest.raises(PermissionError):
        ex.cat("insitu-exchange/jobs/e2e-attack/update/us/y.json")


def test_servers_refuse_unauthenticated_and_unauthorised_callers(deployed: Platform,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Prefect: no credential, no API.
    r = httpx.post(f"{deployed.prefect_api_url}/flow_runs/filter", json={}, timeout=30)
    assert r.status_code == 401
    assert httpx.get(f"{deployed.prefect_api_url}/health", timeout=30).status_code == 200
    # MLflow: no credential → 401; any user but the coordinator's service account may read, not write.
    r = httpx.get(f"{deployed.mlflow_url}/api/2.0/mlflow/registered-models/search", timeout=30)
    assert r.status_code == 401
    name = f"boundary-{uuid.uuid4().hex[:6]}"
    client = MlflowClient(deployed.mlflow_url, registry_uri=deployed.mlflow_url)
    _login(monkeypatch, COORDINATOR, deployed.mlflow_password(COORDINATOR))
    client.create_registered_model(name)
    mallory_pw = uuid.uuid4().hex
    httpx.post(f"{deployed.mlflow_url}/api/2.0/mlflow/users/create", json={"username": "mallory",
               "password": mallory_pw}, auth=("admin", deployed.mlflow_password("admin")), timeout=30)
    for user, pw in (("operator", deployed.mlflow_password("operator")), ("mallory", mallory_pw)):
        _login(monkeypatch, user, pw)
        assert client.get_registered_model(name).name == name  # reading is allowed
        for attempt in (lambda: client.create_model_version(name, "s3://anywhere/model"),
                        lambda: client.set_registered_model_alias(name, "champion", "1"),
                        lambda: client.create_registered_model(f"{name}-squat")):
            with pytest.raises(MlflowException) as e:
                attempt()
            assert e.value.get_http_status_code() == 403, e.value


def _login(monkeypatch: pytest.MonkeyPatch, user: str, password: str) -> None:
    """MLflow's client reads its credentials from the environment at every request."""
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)


def test_a_site_dask_scheduler_admits_only_that_sites_processes(deployed: Platform) -> None:
    from distributed import Client
    from distributed.security import Security

    with Client(deployed.dask_address("eu"), timeout=10, security=deployed.dask_security("eu")) as c:
        assert c.submit(sum, [1, 2]).result() == 3
    plain = deployed.dask_address("eu").replace("tls://", "tcp://")
    for address, security in ((deployed.dask_address("eu"), deployed.dask_security("us")), (plain, Security())):
        with pytest.raises((OSError, TimeoutError)):  # another site's certificate; no certificate at all
            Client(address, timeout=5, security=security)


def test_the_coordinator_sends_no_sites_work_to_a_moved_deployment(deployed: Platform) -> None:
    """Someone moves `site-prepare/apac` onto us's pool: the coordinator refuses to start the job's prepare."""
    from prefect.client.schemas.actions import DeploymentUpdate

    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name("site-prepare/apac")
        client.update_deployment(dep.id, DeploymentUpdate(work_pool_name="insitu-us"))
        try:
            coordinator = client.read_deployment_by_name("retrain/coordinator")
            fr = client.create_flow_run_from_deployment(coordinator.id, parameters={
                "params": {"training": "fraud", "job_id": f"e2e-attack-moved-{uuid.uuid4().hex[:6]}"}})
            fr = wait_for_flow_run(fr.id, 600)
            prepared = [r for r in client.read_flow_runs() if r.name.startswith("site-prepare-apac-e2e-attack-moved")]
        finally:
            client.update_deployment(dep.id, DeploymentUpdate(work_pool_name="insitu-apac"))
    assert fr.state.is_failed(), fr.state
    assert "site-prepare/apac is on pool 'insitu-us', not site apac's pool 'insitu-apac'" in fr.state.message
    assert prepared == []
