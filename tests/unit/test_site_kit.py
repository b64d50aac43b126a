"""A site's kit holds its own secrets and nothing of another site or of the operator, and a site started from its kit
alone (``SiteRuntime``) gets exactly the environment the platform builds for it (no processes started)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from deployments.platform import Platform, PlatformError, site_kit
from deployments.platform.site_runtime import SiteRuntime


@pytest.fixture
def platform(tmp_path: Path, conf_dir: Path) -> Platform:
    p = Platform(tmp_path / "op", conf_dir, free_ports=True, isolate_users=False)
    p.state["secrets"]["s3"] = {
        "exchange": {a: {"access_key": f"AKIA-x-{a}", "secret_key": f"sx-{a}"} for a in p.actors},
        **{s: {s: {"access_key": f"AKIA-{s}", "secret_key": f"s-{s}"}} for s in p.sites.names},
    }
    return p


def _kit(p: Platform, site: str) -> dict:
    kit = site_kit.build(p._state, p._urls, site, p.dir, None, None, False)
    site_kit.write(site_kit.kit_file(p.dir, site), kit)
    return kit


def _secret_values(node: object) -> set[str]:
    if isinstance(node, dict):
        return set().union(*(_secret_values(v) for v in node.values())) if node else set()
    return {node} if isinstance(node, str) else set()


def test_a_kit_holds_its_own_site_s_secrets_and_nothing_of_another(platform: Platform) -> None:
    p = platform
    kit = _kit(p, "eu")
    text = json.dumps(kit)
    s = p.state["secrets"]
    assert kit["secrets"]["audit"] == {"eu": s["audit"]["eu"]}
    assert kit["secrets"]["s3"] == {"eu": s["s3"]["eu"], "exchange": {"eu": s["s3"]["exchange"]["eu"]}}
    foreign = (_secret_values(s) - _secret_values(kit["secrets"])) - {s["prefect_auth"]}
    assert foreign and not [v for v in foreign if v in text]  # no other site's, the coordinator's, MLflow's, PG's
    assert (site_kit.kit_file(p.dir, "eu").stat().st_mode & 0o777) == 0o600
    assert not site_kit.write(site_kit.kit_file(p.dir, "eu"), kit)  # unchanged: not rewritten (no worker restart)


@pytest.mark.parametrize("wan", [None, {"rtt_ms": 80.0}])
def test_a_site_started_from_its_kit_alone_gets_the_platform_s_environment_for_it(platform: Platform, conf_dir: Path,
                                                                               wan: dict | None) -> None:
    p = platform
    if wan:
        p.borders.record({"eu": wan})
    _kit(p, "eu")
    p._state.save()
    p.state_file.rename(p.dir / "elsewhere.json")  # the site reads no operator's state file
    runtime = SiteRuntime(p.dir, "eu", conf_dir)
    assert runtime.env() == p.site_env("eu")
    assert {c.name for c in runtime.components} == {"audit-eu", "s3-eu", "dask-scheduler-eu", "dask-workers-eu",
                                                    "worker-insitu-eu"}
    dask = next(c for c in runtime.components if c.name == "dask-workers-eu")
    assert dask.env == {**p.dask_env("eu"), "PYTHONPATH": dask.env["PYTHONPATH"]}


def test_a_kit_copied_to_a_site_s_host_points_its_identity_there(platform: Platform, conf_dir: Path,
                                                                 tmp_path: Path) -> None:
    p = platform
    _kit(p, "eu")
    ident = p.identity_file("eu")
    ident.parent.mkdir(parents=True)
    ident.write_text(json.dumps({"actor": "eu", "audit_log": str(p.audit_log("eu")), "work_pool": "insitu-eu",
                                 "policy": str(p.policy_file("eu")), "audit_socket": str(p.audit_socket("eu"))}))
    host = tmp_path / "eu-host"
    for d in ("admin/eu", "sites"):
        shutil.copytree(p.dir / d, host / d)
    runtime = SiteRuntime(host, "eu", conf_dir)
    assert runtime.relocate()
    moved = json.loads((host / "admin" / "eu" / "identity.json").read_text())
    assert moved["audit_log"] == str(host / "audit" / "eu" / "eu.jsonl")
    assert moved["policy"] == str(host / "admin" / "eu" / "policy.json")
    assert moved["audit_socket"] == str(host / "audit" / "eu.sock")  # one network: the socket is a file there
    assert json.loads(site_kit.kit_file(host, "eu").read_text())["root"] == str(host)
    assert not SiteRuntime(host, "eu", conf_dir).relocate()  # once


def test_a_missing_or_foreign_kit_is_refused_with_the_fix(platform: Platform, conf_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(PlatformError, match="no kit for site 'eu'.*copy the site's files"):
        SiteRuntime(tmp_path / "empty", "eu", conf_dir)
    p = platform
    _kit(p, "us")
    shutil.copy(site_kit.kit_file(p.dir, "us"), site_kit.kit_file(p.dir, "eu"))
    with pytest.raises(PlatformError, match="a kit for site 'us'"):
        SiteRuntime(p.dir, "eu", conf_dir)
    with pytest.raises(PlatformError, match="not in .*sites.yaml"):
        SiteRuntime(p.dir, "mars", conf_dir)


def test_the_site_s_admin_says_where_the_control_plane_is(platform: Platform, conf_dir: Path) -> None:
    p = platform
    _kit(p, "eu")
    runtime = SiteRuntime(p.dir, "eu", conf_dir)
    runtime.reach_control_plane_at("cp.bank.example")
    env = SiteRuntime(p.dir, "eu", conf_dir).env()
    assert env["PREFECT_API_URL"] == f"http://cp.bank.example:{p.port('prefect')}/api"
    assert env["INSITU_EXCHANGE_S3_ENDPOINT"] == f"http://cp.bank.example:{p.port('s3-exchange')}"
    assert env["INSITU_EU_S3_ENDPOINT"] == p.s3_endpoint("eu")  # its own store stays on its own host
    for bad in ("http://x", "x:80", ""):
        with pytest.raises(PlatformError, match="host name or address only"):
            runtime.reach_control_plane_at(bad)


def test_relocation_reads_no_file_a_link_points_at(platform: Platform, conf_dir: Path, tmp_path: Path) -> None:
    p = platform
    _kit(p, "eu")
    host = tmp_path / "eu-host"
    shutil.copytree(p.dir / "sites", host / "sites")
    (host / "admin" / "eu").mkdir(parents=True)
    secret = tmp_path / "state.json"
    secret.write_text('{"secrets": "the operator\'s"}')
    (host / "admin" / "eu" / "identity.json").symlink_to(secret)
    with pytest.raises(OSError):
        SiteRuntime(host, "eu", conf_dir).relocate()
    assert (host / "admin" / "eu" / "identity.json").is_symlink()  # left as it was, nothing copied


def test_a_platform_directory_replaced_by_a_symlink_is_refused_not_followed(tmp_path: Path) -> None:
    from deployments.platform.users import current_account, make_private_dir

    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    (tmp_path / "logs").symlink_to(target)
    with pytest.raises(PermissionError, match="is a symlink"):
        make_private_dir(tmp_path / "logs", current_account(), 0o700)
    assert oct(target.stat().st_mode & 0o777) == "0o755"  # what the link points at is untouched
    made = make_private_dir(tmp_path / "audit" / "eu", current_account(), 0o700)
    assert oct(made.stat().st_mode & 0o777) == "0o700"
