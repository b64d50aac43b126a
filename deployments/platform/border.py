"""Each site's border on the local platform: the WAN profile its relay plays between it and the control plane.

A site whose ``sites.yaml`` entry has a ``wan`` profile (or that ``insitu up --wan`` / ``insitu wan set`` gave one)
reaches the control plane's servers it talks to — the exchange's store and the Prefect API — through its own relay
(``wan_relay``), one listening port per server; everything inside the site (its store, Dask, ``torch.distributed``,
its audit service) stays direct. The profile in force is recorded in the state file, so later ``insitu up`` calls and
``insitu wan`` commands see the same one. A site without a profile has no relay (today's loopback).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deployments.platform.errors import PlatformError
from deployments.platform.state import PlatformState, free_port
from insitu.conf import SitesConfig, WanProfile

# The control plane's servers a site talks to: port name in the state file → what it is.
CROSSING = {"s3-exchange": "the exchange's store", "prefect": "the Prefect API"}


def parse_profile(text: str) -> tuple[str, dict[str, float] | None]:
    """``SITE:rtt_ms=80,mbit=50,loss=0.001`` → (site, profile); ``SITE:`` alone is a zero profile (a relay, no cost);
    ``SITE:off`` is no border at all (``None``), whatever ``sites.yaml`` says."""
    site, _, rest = text.partition(":")
    if not site or not _:
        raise PlatformError(f"--wan {text!r}: write SITE:rtt_ms=80,mbit=50,loss=0.001 (or SITE:off)")
    if rest == "off":
        return site, None
    profile: dict[str, float] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in WanProfile.model_fields:
            raise PlatformError(f"--wan {text!r}: {item!r} is not KEY=VALUE with KEY one of "
                                f"{', '.join(WanProfile.model_fields)}")
        try:
            profile[key] = float(value)
        except ValueError:
            raise PlatformError(f"--wan {text!r}: {key} must be a number, not {value!r}") from None
    WanProfile.model_validate(profile)  # the same bounds as sites.yaml
    return site, profile


class Borders:
    """Which sites have a relay, with which profile, on which ports; and the operator's controls of a running one."""

    def __init__(self, sites: SitesConfig, state: PlatformState, wan_dir: Path,
                 listen_host: Callable[[str], str] = lambda site: "127.0.0.1") -> None:
        self._sites = sites
        self._state = state
        self._dir = wan_dir
        # Where a site's relay listens: loopback, or (isolated) the control plane's end of that site's border only.
        self.listen_host = listen_host

    def record(self, overrides: dict[str, dict[str, float] | None]) -> None:
        """Keep profiles given on the command line (they win over ``sites.yaml`` until changed again); ``None``: no
        border for that site."""
        for site, profile in overrides.items():
            if site not in self._sites.names:
                raise PlatformError(f"--wan {site}: no such site in sites.yaml (sites: {', '.join(self._sites.names)})")
            kept = None if profile is None else WanProfile.model_validate(profile).model_dump()
            self._state.data.setdefault("wan", {})[site] = kept
        for site in self.sites:  # each relay's ports, chosen once and kept in the state file
            for server in CROSSING:
                self.port(site, server)

    def profile(self, site: str) -> WanProfile | None:
        recorded = self._state.data.get("wan", {})
        if site in recorded:
            return None if recorded[site] is None else WanProfile.model_validate(recorded[site])
        return self._sites.site(site).wan

    @property
    def sites(self) -> list[str]:
        """The sites behind a relay."""
        return [s for s in self._sites.names if self.profile(s) is not None]

    def port(self, site: str, server: str) -> int:
        """The relay's port for ``server`` (a key of ``CROSSING``), chosen once and recorded."""
        name = f"wan-{site}-{server}"
        ports = self._state.data["ports"]
        if name not in ports:
            ports[name] = free_port()
        return int(ports[name])

    def config_file(self, site: str) -> Path:
        return self._dir / f"{site}.json"

    def write_config(self, site: str) -> Path:
        """The relay's routes and profile (nothing secret: ports and numbers)."""
        profile = self.profile(site)
        assert profile is not None
        routes = [[self.port(site, server), "127.0.0.1", self._state.port(server)] for server in CROSSING]
        self._dir.mkdir(parents=True, exist_ok=True)
        path = self.config_file(site)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"listen": routes, "bind": self.listen_host(site), "wan": profile.model_dump()}))
        os.replace(tmp, path)
        return path

    def behind(self, actor: str | None) -> bool:
        """Does ``actor`` (a site) reach the control plane through a relay?"""
        return actor in self._sites.names and self.profile(actor) is not None  # type: ignore[operator]

    def write_configs(self) -> list[str]:
        """Each relay's configuration; returns the sites whose configuration changed."""
        changed = []
        for site in self.sites:
            before = self.config_file(site).read_text() if self.config_file(site).exists() else None
            if self.write_config(site).read_text() != before:
                changed.append(site)
        return changed

    # ------------------------------------------------------------------ a running relay
    def _signal(self, site: str, sig: signal.Signals) -> None:
        from deployments.platform.processes import alive

        name = f"wan-{site}"
        pid = self._state.data.get("pids", {}).get(name)
        if not alive(pid, self._state.data.get("started", {}).get(name)):
            raise PlatformError(f"{site} has no border relay running: give it a profile (`insitu up --wan "
                                f"{site}:rtt_ms=0`, or `wan:` in sites.yaml), then `insitu down` and `insitu up`")
        os.kill(pid, sig)

    def set(self, site: str, profile: dict[str, float]) -> dict[str, Any]:
        """A new profile for a running relay (it re-reads its file on SIGHUP); kept for the next ``up``."""
        self.record({site: profile})
        self._state.save()
        self.write_config(site)
        self._signal(site, signal.SIGHUP)
        return self._state.data["wan"][site]

    def cut(self, site: str) -> None:
        """Hold every byte between the site and the control plane, both ways, until :meth:`restore`."""
        self._signal(site, signal.SIGUSR1)

    def restore(self, site: str) -> None:
        self._signal(site, signal.SIGUSR2)
