"""The isolated platform's plan (pure logic: no namespace is made here): a private range clear of the host's, names
that fit the kernel's limits, each actor's view of the control plane, and when switching is refused."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from deployments.platform import PlatformError
from deployments.platform.endpoints import Endpoints
from deployments.platform.netns import CONTROL, NetPlan, choose_network, choose_octet


def test_the_range_is_clear_of_every_network_the_host_has() -> None:
    free = choose_octet("/state/a", taken=[])
    assert choose_octet("/state/a", taken=[]) == free  # the same directory tries the same range first
    taken = [ipaddress.ip_network(f"10.{free}.3.0/24")]
    other = choose_octet("/state/a", taken=taken)
    assert other != free and not ipaddress.ip_network(f"10.{other}.0.0/16").overlaps(taken[0])
    with pytest.raises(PlatformError, match="no free 10.N.0.0/16"):
        choose_octet("/state/a", taken=[ipaddress.ip_network("10.0.0.0/8")])


def test_names_and_addresses() -> None:
    plan = NetPlan("abc123", 77, ("eu", "us", "apac"))
    assert plan.namespaces == ["insitu-abc123-cp", "insitu-abc123-eu", "insitu-abc123-us", "insitu-abc123-apac"]
    assert plan.host_address == "10.77.0.1" and plan.control_address(None) == "10.77.0.2"
    assert plan.control_address("us") == "10.77.2.1" and plan.site_address("us") == "10.77.2.2"
    for k in range(len(plan.sites) + 1):
        assert all(len(end) <= 15 for end in plan._link(k))  # IFNAMSIZ
    assert NetPlan.from_record(plan.record()) == plan
    assert NetPlan.from_record(plan.record(), ["eu", "us", "apac", "latam"]).site_address("latam") == "10.77.4.2"
    with pytest.raises(PlatformError, match="no border"):
        plan.site_address("mars")


def test_each_actor_reaches_the_control_plane_from_where_it_is(tmp_path: Path, conf_dir: Path) -> None:
    from deployments.platform import Platform

    p = Platform(tmp_path, conf_dir, free_ports=True, isolate_users=False)
    plan = NetPlan("abc123", 77, tuple(p.sites.names))
    urls = Endpoints(p._state, None, plan)
    port = p.port("prefect")
    assert urls.prefect_api_url_for("eu") == f"http://10.77.1.1:{port}/api"  # across its own border
    assert urls.prefect_api_url_for("coordinator") == f"http://127.0.0.1:{port}/api"  # inside the control plane
    assert urls.prefect_api_url == f"http://10.77.0.2:{port}/api"  # the operator, on the host
    assert urls.s3_endpoint("eu") == f"http://127.0.0.1:{p.port('s3-eu')}"  # inside eu only
    assert urls.bind_host == "0.0.0.0" and Endpoints(p._state).bind_host == "127.0.0.1"


def test_switching_is_refused_while_running_and_isolation_needs_root(tmp_path: Path) -> None:
    rec = NetPlan("abc123", 77, ("eu",)).record()
    with pytest.raises(PlatformError, match="running isolated.*`insitu down`"):
        choose_network({"isolated": rec}, tmp_path, ["eu"], False, True, ["prefect-server"])
    with pytest.raises(PlatformError, match="running on one network"):
        choose_network({}, tmp_path, ["eu"], True, True, ["prefect-server"])
    with pytest.raises(PlatformError, match="--isolated needs root"):
        choose_network({}, tmp_path, ["eu"], True, False, [])
    assert choose_network({}, tmp_path, ["eu"], None, True, []) is None
    kept = choose_network({"isolated": rec}, tmp_path, ["eu"], None, True, ["x"])
    assert kept is not None and kept.ns(CONTROL) == "insitu-abc123-cp"


def test_a_border_relay_on_an_isolated_platform_listens_on_its_own_link_only(tmp_path: Path, conf_dir: Path) -> None:
    import json

    from deployments.platform import Platform
    from deployments.platform.border import Borders

    p = Platform(tmp_path, conf_dir, free_ports=True, isolate_users=False)
    plan = NetPlan("abc123", 77, tuple(p.sites.names))
    borders = Borders(p.sites, p._state, tmp_path / "wan", plan.control_address)
    borders.record({"eu": {"rtt_ms": 80.0}})
    urls = Endpoints(p._state, borders, plan)
    relay = borders.port("eu", "prefect")
    assert urls.prefect_api_url_for("eu") == f"http://10.77.1.1:{relay}/api"
    assert urls.prefect_api_url_for("us") == f"http://10.77.2.1:{p.port('prefect')}/api"  # no border profile
    config = json.loads(borders.write_config("eu").read_text())
    assert config["bind"] == "10.77.1.1"  # the control plane's end of eu's link: no other site reaches it


def test_a_site_keeps_its_link_when_sites_yaml_drops_or_reorders_sites() -> None:
    rec = NetPlan("abc123", 77, ("eu", "us", "apac")).record()
    later = NetPlan.from_record(rec, ["apac", "latam", "eu"])  # us dropped, the rest reordered, latam added
    assert later.site_address("eu") == "10.77.1.2" and later.site_address("apac") == "10.77.3.2"
    assert later.site_address("latam") == "10.77.4.2"
    assert "insitu-abc123-us" in later.namespaces  # `down` still removes the dropped site's namespace
    state = {"isolated": rec}
    plan = choose_network(state, Path("/x"), ["eu", "latam"], None, True, [])
    assert plan is not None and state["isolated"]["sites"] == ["eu", "us", "apac", "latam"]


def test_a_range_that_something_else_took_since_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import deployments.platform.netns as netns

    plan = NetPlan("abc123", 77, ("eu",))
    monkeypatch.setattr(netns, "_host_networks", lambda: [ipaddress.ip_network("10.77.9.0/24")])
    monkeypatch.setattr(netns, "_ip", lambda *a, **kw: __import__("subprocess").CompletedProcess(a, 1, "", ""))
    with pytest.raises(PlatformError, match=r"10.77.0.0/16 now overlaps 10.77.9.0/24.*insitu down"):
        plan._check_range_free()
    monkeypatch.setattr(netns, "_host_networks", lambda: [ipaddress.ip_network("10.78.0.0/16")])
    plan._check_range_free()
    # a running platform's own: its host link's /24 with the kernel's local and broadcast routes, its /16 route
    ours = [ipaddress.ip_network(n) for n in ("10.77.0.0/24", "10.77.0.1/32", "10.77.0.255/32", "10.77.0.0/16")]
    monkeypatch.setattr(netns, "_host_networks", lambda: ours)
    monkeypatch.setattr(netns, "_ip", lambda *a, **kw: __import__("subprocess").CompletedProcess(a, 0, "x", ""))
    plan._check_range_free()
