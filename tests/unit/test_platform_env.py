"""Each site's worker gets only its own store's credentials and its own to the exchange (no processes started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployments.platform import COORDINATOR, Platform


@pytest.fixture
def platform(tmp_path: Path, conf_dir: Path) -> Platform:
    p = Platform(tmp_path, conf_dir, free_ports=True, isolate_users=False)
    # What provisioning the S3 endpoints records: one IAM user per site and server.
    p.state["secrets"]["s3"] = {
        "exchange": {a: {"access_key": f"AKIA-x-{a}", "secret_key": f"sx-{a}"} for a in p.actors},
        **{s: {s: {"access_key": f"AKIA-{s}", "secret_key": f"s-{s}"}} for s in p.sites.names},
    }
    return p


def test_site_env_holds_only_its_own_store_and_its_own_exchange_key(platform: Platform) -> None:
    p = platform
    for site in ("eu", "us", "apac"):
        env = p.site_env(site)
        tag = site.upper()
        assert env["INSITU_IDENTITY"] == str(p.identity_file(site))
        assert env[f"INSITU_{tag}_S3_ENDPOINT"] == p.s3_endpoint(site)
        assert env[f"INSITU_{tag}_AWS_SECRET_ACCESS_KEY"] == f"s-{site}"
        assert env["INSITU_EXCHANGE_AWS_SECRET_ACCESS_KEY"] == f"sx-{site}"  # its own IAM user, not a shared one
        others = [o.upper() for o in ("eu", "us", "apac") if o != site]
        leaked = [k for k in env if any(k.startswith(f"INSITU_{o}_") for o in others)]
        assert not leaked, leaked
        assert "MLFLOW_TRACKING_URI" not in env and "INSITU_HOME" not in env
        assert p.state["secrets"]["audit"][COORDINATOR] not in env.values()
        assert p.state["secrets"]["audit"][site] not in env.values()  # it is in the owner-only identity file
        assert env["DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION"] == "True"
        assert env["DASK_DISTRIBUTED__COMM__TLS__CA_FILE"].startswith(str(p.actor_home(site)))
        dask = p.dask_env(site)
        assert "INSITU_EXCHANGE_S3_ENDPOINT" not in dask and f"INSITU_{tag}_S3_ENDPOINT" in dask
        assert "PREFECT_API_AUTH_STRING" not in dask


def test_coordinator_env_holds_no_site_store(platform: Platform) -> None:
    env = platform.coordinator_env()
    assert env["INSITU_IDENTITY"] == str(platform.identity_file(COORDINATOR))
    assert not [k for k in env if k.startswith(("INSITU_EU_", "INSITU_US_", "INSITU_APAC_"))]
    assert env["MLFLOW_TRACKING_URI"].startswith("http://127.0.0.1:")
    assert env["MLFLOW_TRACKING_USERNAME"] == COORDINATOR
    assert env["INSITU_EXCHANGE_AWS_SECRET_ACCESS_KEY"] == f"sx-{COORDINATOR}"


def test_the_operator_reads_mlflow_but_is_not_its_coordinator(platform: Platform) -> None:
    env = platform.operator_env()
    assert env["MLFLOW_TRACKING_USERNAME"] == "operator"
    assert env["PREFECT_API_AUTH_STRING"] == platform.prefect_auth


def test_ports_and_secrets_persist_across_instances(tmp_path: Path, conf_dir: Path) -> None:
    a = Platform(tmp_path, conf_dir, free_ports=True, isolate_users=False)
    a._state.save()
    assert (a.state_file.stat().st_mode & 0o777) == 0o600
    b = Platform(tmp_path, conf_dir, isolate_users=False)
    assert b.state["ports"] == a.state["ports"] and b.state["secrets"] == a.state["secrets"]
    assert len(set(a.state["ports"].values())) == len(a.state["ports"])


def test_a_platform_started_by_an_older_insitu_can_be_stopped_not_reused(tmp_path: Path, conf_dir: Path) -> None:
    import json
    import os

    from deployments.platform import PlatformError

    old = {"ports": {"prefect": 1}, "pids": {"prefect-server": os.getpid()},
           "secrets": {"eu": {"access_key": "a", "secret_key": "b", "audit_key": "00"}}}
    (tmp_path / "state.json").write_text(json.dumps(old))
    p = Platform(tmp_path, conf_dir, isolate_users=False)
    assert p.state["pids"] == old["pids"] and "prefect_auth" in p.state["secrets"]  # down() has what it needs
    with pytest.raises(PlatformError, match="older insitu"):
        p.up()


def test_every_workers_flow_runs_send_heartbeats(platform: Platform) -> None:
    """A run whose process is gone is marked Crashed once its heartbeats stop (deployments/unresponsive.py)."""
    from deployments.unresponsive import HEARTBEAT_S

    for env in (*(platform.site_env(s) for s in platform.sites.names), platform.coordinator_env()):
        assert env["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == str(HEARTBEAT_S)
