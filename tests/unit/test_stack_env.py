"""Each site's worker gets only its own store's credentials and the exchange's (no processes started)."""

from __future__ import annotations

from pathlib import Path

from insitu.stack import REPO, Platform


def test_site_env_holds_only_its_own_store_and_the_exchange(tmp_path: Path) -> None:
    p = Platform(tmp_path, REPO / "conf", free_ports=True)
    for site in ("eu", "us", "apac"):
        env = p.site_env(site)
        tag = site.upper()
        assert env["INSITU_SITE"] == site
        assert env[f"INSITU_{tag}_S3_ENDPOINT"] == p.s3_endpoint(site)
        assert env[f"INSITU_{tag}_AWS_SECRET_ACCESS_KEY"] == p.state["secrets"][site]["secret_key"]
        assert env["INSITU_EXCHANGE_S3_ENDPOINT"] == p.s3_endpoint("exchange")
        others = [o.upper() for o in ("eu", "us", "apac") if o != site]
        leaked = [k for k in env if any(k.startswith(f"INSITU_{o}_") for o in others)]
        assert not leaked, leaked
        assert "MLFLOW_TRACKING_URI" not in env
        assert p.state["secrets"]["coordinator"]["audit_key"] not in env.values()
        dask = p.dask_env(site)
        assert "INSITU_EXCHANGE_S3_ENDPOINT" not in dask and f"INSITU_{tag}_S3_ENDPOINT" in dask


def test_coordinator_env_holds_no_site_store(tmp_path: Path) -> None:
    env = Platform(tmp_path, REPO / "conf", free_ports=True).coordinator_env()
    assert "INSITU_SITE" not in env and env["INSITU_ROLE"] == "coordinator"
    assert not [k for k in env if k.startswith(("INSITU_EU_", "INSITU_US_", "INSITU_APAC_"))]
    assert env["MLFLOW_TRACKING_URI"].startswith("http://127.0.0.1:")


def test_ports_and_keys_persist_across_instances(tmp_path: Path) -> None:
    a = Platform(tmp_path, REPO / "conf", free_ports=True)
    a._save_state()
    b = Platform(tmp_path, REPO / "conf")
    assert b.state["ports"] == a.state["ports"] and b.state["secrets"] == a.state["secrets"]
    assert len(set(a.state["ports"].values())) == len(a.state["ports"])
