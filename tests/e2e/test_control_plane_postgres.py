"""The control plane on PostgreSQL, on the shared platform: each server its own role and database, the data
directory owner-only, and a Prefect, MLflow and database crash (SIGKILL, all three) loses nothing they acknowledged.

Runs on the PostgreSQL control plane the platform chose (the default wherever the server is installed; CI installs
it); ``test_platform_restart`` runs a whole job across ``insitu down`` / ``up`` on the same platform.
"""

from __future__ import annotations

import os
import signal
import stat
import uuid
from typing import Any

import httpx
import psutil
import pytest
from mlflow.tracking import MlflowClient

from deployments.platform import Platform, postgres
from deployments.platform.health import prefect_headers

pytestmark = [pytest.mark.e2e]


@pytest.fixture
def on_postgres(deployed: Platform) -> Platform:
    if deployed.database != "postgres":
        assert not postgres.available(), "PostgreSQL is installed, yet the platform chose SQLite"
        pytest.skip("PostgreSQL's server is not installed here (`apt-get install postgresql`)")
    return deployed


def _port(p: Platform) -> int:
    return int(p.state["ports"]["postgres"])


def _refused(p: Platform, user: str, password: str, dbname: str) -> str:
    """The server's refusal of ``user`` on ``dbname`` (fails the test if it let them in)."""
    import psycopg2

    try:
        postgres.connect(_port(p), user, password, dbname).close()  # type: ignore[attr-defined]
    except psycopg2.OperationalError as e:
        return str(e)
    raise AssertionError(f"{user} connected to {dbname}")


def test_each_server_reaches_only_its_own_database_and_the_files_are_the_databases_own(on_postgres: Platform) -> None:
    p = on_postgres
    pw = {r: p.database_password(r) for r in ("superuser", "prefect", "mlflow")}
    assert "password authentication failed" in _refused(p, "prefect", "not-the-password", "prefect")
    assert "password authentication failed" in _refused(p, "prefect", pw["mlflow"], "prefect")
    assert "permission denied for database" in _refused(p, "mlflow", pw["mlflow"], "prefect")
    assert "permission denied for database" in _refused(p, "prefect", pw["prefect"], "mlflow_auth")
    # The servers' state is in their databases, not in SQLite files beside them.
    assert not list(p.dir.rglob("*.db")), list(p.dir.rglob("*.db"))
    # Owner-only, and (as root) not root's and no actor's: the database's own account.
    data = p.dir / "postgres" / "data"
    for d in (data.parent, data):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    if os.geteuid() == 0:
        assert data.owner() == "insitu-postgres" and p.account("eu").name != "insitu-postgres"
    # Listening on loopback only, and on no Unix socket.
    main = psutil.Process(p.state["pids"]["postgres"])
    listening = [c for c in main.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert listening and {c.laddr.ip for c in listening} == {"127.0.0.1"}, listening
    assert not main.net_connections(kind="unix")


def _prefect_state(p: Platform) -> dict[str, Any]:
    h = prefect_headers(p.prefect_auth)
    with httpx.Client(base_url=p.prefect_api_url, headers=h, timeout=30) as c:
        runs = c.post("/flow_runs/filter", json={"limit": 200}).raise_for_status().json()
        deployments = c.post("/deployments/filter", json={}).raise_for_status().json()
        pools = c.post("/work_pools/filter", json={}).raise_for_status().json()
    return {"runs": {r["id"]: r["state_type"] for r in runs}, "deployments": sorted(d["id"] for d in deployments),
            "pools": sorted((w["name"], str(w["base_job_template"])) for w in pools)}


def _mlflow_state(p: Platform) -> dict[str, Any]:
    client = MlflowClient(p.mlflow_url)
    return {"experiments": sorted(e.name for e in client.search_experiments()),
            "models": sorted((m.name, tuple(sorted(m.aliases))) for m in client.search_registered_models())}


def _rows(p: Platform, role: str, table: str) -> int:
    conn = postgres.connect(_port(p), role, p.database_password(role), role)
    try:
        with conn.cursor() as cur:  # type: ignore[attr-defined]
            cur.execute(f"SELECT count(*) FROM {table}")  # noqa: S608 (the test's own table names)
            return int(cur.fetchone()[0])
    finally:
        conn.close()  # type: ignore[attr-defined]


def test_prefect_mlflow_and_the_database_killed_lose_nothing(on_postgres: Platform) -> None:
    p = on_postgres
    # Something to lose, acknowledged just before the crash: a flow run (of no deployment: no worker takes it) and
    # an MLflow experiment.
    tag = uuid.uuid4().hex[:6]
    h = prefect_headers(p.prefect_auth)
    with httpx.Client(base_url=p.prefect_api_url, headers=h, timeout=30) as c:
        flow = c.post("/flows/", json={"name": "e2e-pg-probe"}).raise_for_status().json()
        run = c.post("/flow_runs/", json={"flow_id": flow["id"], "name": f"e2e-pg-probe-{tag}",
                                          "state": {"type": "COMPLETED"}}).raise_for_status().json()
    httpx.post(f"{p.mlflow_url}/api/2.0/mlflow/experiments/create", json={"name": f"e2e-pg-probe-{tag}"},
               auth=("admin", p.mlflow_password("admin")), timeout=30).raise_for_status()
    before_prefect, before_mlflow = _prefect_state(p), _mlflow_state(p)
    assert run["id"] in before_prefect["runs"] and f"e2e-pg-probe-{tag}" in before_mlflow["experiments"]
    assert before_prefect["deployments"] and before_prefect["pools"] and before_mlflow["experiments"]
    flow_runs_in_db = _rows(p, "prefect", "flow_run")
    assert flow_runs_in_db == len(before_prefect["runs"]) or len(before_prefect["runs"]) == 200

    victims = ["prefect-server", "mlflow-server", "postgres"]
    mains = [psutil.Process(p.state["pids"][n]) for n in victims]
    children = [c for m in mains for c in m.children(recursive=True)]
    assert children  # MLflow's uvicorn worker, PostgreSQL's backends: what a crash of the main process leaves
    for proc in mains:  # a crash, not a shutdown: nothing gets to flush on its way out
        proc.send_signal(signal.SIGKILL)
    psutil.wait_procs(mains, timeout=30)
    # `up` kills what the crashed servers left (a worker still holding the port) and starts them again.
    started = p.up()["started"]
    assert sorted(started) == sorted(victims), started  # the workers, stores and Dask stayed up
    assert not [c.pid for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert all(p._processes.is_ours(n) for n in victims)  # the new ones run (none died on a port held)
    assert p.up()["started"] == []

    after = _prefect_state(p)
    # Every run is there in the state it had (the restarted scheduler may add the schedules' next runs).
    assert after["runs"].items() >= before_prefect["runs"].items()
    assert after["deployments"] == before_prefect["deployments"] and after["pools"] == before_prefect["pools"]
    assert _mlflow_state(p) == before_mlflow
    assert _rows(p, "prefect", "flow_run") >= flow_runs_in_db
    httpx.delete(f"{p.prefect_api_url}/flow_runs/{run['id']}", headers=h, timeout=30).raise_for_status()

