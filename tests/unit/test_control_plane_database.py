"""The control plane's database: chosen once per platform, its passwords only in the servers' environments.

No process is started here; ``tests/e2e/test_control_plane_postgres.py`` runs the real server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployments.platform import Platform, PlatformError
from deployments.platform.processes import stop_tier


@pytest.fixture
def pg_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("deployments.platform.postgres.available", lambda: True)
    monkeypatch.setattr("deployments.platform.postgres.bindir", lambda: Path("/usr/lib/postgresql/15/bin"))


def test_a_new_platform_runs_on_postgres_where_it_is_installed_else_sqlite(
        tmp_path: Path, conf_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("deployments.platform.postgres.available", lambda: True)
    assert Platform(tmp_path / "a", conf_dir, free_ports=True, isolate_users=False).database == "postgres"
    monkeypatch.setattr("deployments.platform.postgres.available", lambda: False)
    assert Platform(tmp_path / "b", conf_dir, free_ports=True, isolate_users=False).database == "sqlite"
    asked = Platform(tmp_path / "c", conf_dir, free_ports=True, isolate_users=False, database="postgres")
    assert asked.database == "postgres"


def test_the_choice_is_kept_for_the_platforms_life(tmp_path: Path, conf_dir: Path, pg_installed: None) -> None:
    p = Platform(tmp_path, conf_dir, free_ports=True, isolate_users=False, database="sqlite")
    p._state.save()
    assert Platform(tmp_path, conf_dir, isolate_users=False).database == "sqlite"  # not switched by a default
    with pytest.raises(PlatformError, match=r"keeps its runs and models in sqlite.*--database sqlite.*down --wipe"):
        Platform(tmp_path, conf_dir, isolate_users=False, database="postgres")
    with pytest.raises(PlatformError, match="choose one of postgres, sqlite"):
        Platform(tmp_path / "x", conf_dir, free_ports=True, isolate_users=False, database="mysql")


def test_a_platform_from_before_the_choice_keeps_sqlite_and_gets_a_port_and_passwords(
        tmp_path: Path, conf_dir: Path, pg_installed: None) -> None:
    p = Platform(tmp_path, conf_dir, free_ports=True, isolate_users=False)
    del p.state["database"], p.state["ports"]["postgres"], p.state["secrets"]["postgres"]
    p._state.save()
    old = json.loads(p.state_file.read_text())
    q = Platform(tmp_path, conf_dir, isolate_users=False)
    assert q.database == "sqlite"
    assert q.state["ports"]["prefect"] == old["ports"]["prefect"] and q.state["ports"]["postgres"]
    assert set(q.state["secrets"]["postgres"]) == {"superuser", "prefect", "mlflow"}


def test_each_server_gets_only_its_own_database_password_and_never_on_its_command_line(
        tmp_path: Path, conf_dir: Path, pg_installed: None) -> None:
    p = Platform(tmp_path, conf_dir, free_ports=True, isolate_users=False, database="postgres")
    comps = {c.name: c for c in p._components.all()}
    passwords = {r: p.database_password(r) for r in ("superuser", "prefect", "mlflow")}
    assert len(set(passwords.values())) == 3
    for c in comps.values():
        assert not [pw for pw in passwords.values() if any(pw in arg for arg in c.command)], c.name
    prefect_env = comps["prefect-server"].env
    db_url = prefect_env["PREFECT_SERVER_DATABASE_CONNECTION_URL"]
    assert db_url.startswith(f"postgresql+asyncpg://prefect:{passwords['prefect']}@127.0.0.1:")
    assert db_url.endswith("/prefect")
    mlflow = comps["mlflow-server"]
    assert mlflow.env["PGPASSWORD"] == passwords["mlflow"]
    assert "postgresql+psycopg2://mlflow@127.0.0.1:" in " ".join(mlflow.command)
    # Only those two hold a database password; no actor's process, and not the operator's clients.
    holders = sorted(n for n, c in comps.items() if set(passwords.values()) & set(c.env.values())
                     or any(pw in v for v in c.env.values() for pw in passwords.values()))
    assert holders == ["mlflow-server", "prefect-server"]
    operator = " ".join(p.operator_env().values())
    assert not [pw for pw in passwords.values() if pw in operator]
    assert comps["postgres"].account is not None and "listen_addresses=127.0.0.1" in comps["postgres"].command


def test_mlflow_auth_keeps_its_users_in_a_database_of_its_own(tmp_path: Path, conf_dir: Path,
                                                            pg_installed: None) -> None:
    p = Platform(tmp_path, conf_dir, free_ports=True, isolate_users=False, database="postgres")
    assert p._components.mlflow_auth_uri().endswith("/mlflow_auth")
    assert p._components.mlflow_backend_uri().endswith("/mlflow")
    s = Platform(tmp_path / "s", conf_dir, free_ports=True, isolate_users=False, database="sqlite")
    assert s._components.database() == []
    assert s._components.mlflow_backend_uri().startswith("sqlite:///")
    assert "PREFECT_SERVER_DATABASE_CONNECTION_URL" not in {c.name: c for c in s._components.all()}[
        "prefect-server"].env


def test_the_database_stops_after_the_servers_that_write_to_it() -> None:
    assert stop_tier("postgres") > max(stop_tier(n) for n in ("prefect-server", "mlflow-server", "worker-insitu-eu",
                                                               "dask-workers-eu", "s3-exchange"))
