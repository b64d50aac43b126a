"""Which processes cross a site's border: a site with a WAN profile reaches the exchange and the Prefect API through
its own relay; its store, its Dask cluster and the operator stay direct; a site without one is unchanged.

No process is started here (``tests/unit/test_wan_relay.py`` runs the relay, ``tests/e2e/test_wan_border.py`` the
platform behind it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployments.platform import Platform, PlatformError
from deployments.platform.border import parse_profile


def _platform(tmp_path: Path, conf_dir: Path, **kw: object) -> Platform:
    return Platform(tmp_path, conf_dir, free_ports=True, isolate_users=False, database="sqlite", **kw)


def test_a_profile_is_parsed_with_the_bounds_of_sites_yaml() -> None:
    assert parse_profile("eu:rtt_ms=80,mbit=50,loss=0.001") == ("eu", {"rtt_ms": 80, "mbit": 50, "loss": 0.001})
    assert parse_profile("eu:") == ("eu", {})
    assert parse_profile("eu:off") == ("eu", None)
    for bad, why in [("eu", "SITE:rtt_ms"), ("eu:lag=3", "KEY one of rtt_ms, mbit, loss"),
                     ("eu:rtt_ms=fast", "must be a number"), ("eu:loss=1.5", "less than 1")]:
        with pytest.raises(Exception, match=why):
            parse_profile(bad)


def test_only_a_site_with_a_profile_crosses_its_border_and_only_to_the_control_plane(
        tmp_path: Path, conf_dir: Path) -> None:
    p = _platform(tmp_path, conf_dir, wan={"eu": {"rtt_ms": 80, "mbit": 50}})
    assert p.borders.sites == ["eu"]
    ports = p.state["ports"]
    relay_exchange, relay_prefect = ports["wan-eu-s3-exchange"], ports["wan-eu-prefect"]
    eu = p.site_env("eu")
    assert eu["INSITU_EXCHANGE_S3_ENDPOINT"] == f"http://127.0.0.1:{relay_exchange}"
    assert eu["PREFECT_API_URL"] == f"http://127.0.0.1:{relay_prefect}/api"
    assert eu["INSITU_EU_S3_ENDPOINT"] == p.s3_endpoint("eu")  # its own store: inside the site
    assert p.dask_env("eu")["INSITU_EU_S3_ENDPOINT"] == p.s3_endpoint("eu")
    us = p.site_env("us")
    assert us["INSITU_EXCHANGE_S3_ENDPOINT"] == p.s3_endpoint("exchange") and us["PREFECT_API_URL"] == p.prefect_api_url
    operator = p.operator_env()
    assert operator["INSITU_EXCHANGE_S3_ENDPOINT"] == p.s3_endpoint("exchange")
    assert p.coordinator_env()["PREFECT_API_URL"] == p.prefect_api_url  # the coordinator is the control plane
    comps = {c.name for c in p._components.all()}
    assert "wan-eu" in comps and "wan-us" not in comps
    route = json.loads(p.borders.write_config("eu").read_text())
    assert route == {"listen": [[relay_exchange, "127.0.0.1", ports["s3-exchange"]],
                                [relay_prefect, "127.0.0.1", ports["prefect"]]], "bind": "127.0.0.1",
                     "wan": {"rtt_ms": 80.0, "mbit": 50.0, "loss": 0.0}}


def test_a_profile_given_once_is_kept_and_off_removes_the_border(tmp_path: Path, conf_dir: Path) -> None:
    p = _platform(tmp_path, conf_dir, wan={"eu": {"rtt_ms": 20}})
    p._state.save()
    again = Platform(tmp_path, conf_dir, isolate_users=False)
    assert again.borders.profile("eu").rtt_ms == 20 and again.state["ports"]["wan-eu-prefect"] == \
        p.state["ports"]["wan-eu-prefect"]
    off = Platform(tmp_path, conf_dir, isolate_users=False, wan={"eu": None})
    assert off.borders.sites == [] and off.site_env("eu")["PREFECT_API_URL"] == off.prefect_api_url
    with pytest.raises(PlatformError, match="no such site"):
        Platform(tmp_path, conf_dir, isolate_users=False, wan={"mars": {}})


def test_cutting_a_border_that_has_no_relay_says_how_to_give_it_one(tmp_path: Path, conf_dir: Path) -> None:
    p = _platform(tmp_path, conf_dir, wan={"eu": {}})
    with pytest.raises(PlatformError, match=r"eu has no border relay running.*--wan eu:rtt_ms=0"):
        p.borders.cut("eu")
