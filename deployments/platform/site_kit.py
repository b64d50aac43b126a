"""A region's kit: what a site needs to start on its own host, and nothing of another site or of the operator.

``<root>/sites/<site>.json`` (0600, root's): the site's own secrets (its audit service's keys, its store's IAM keys
once its store issued them, its IAM keys to the exchange), the control plane's address and ports *as the site
reaches them* (across its border), the Prefect API's credential, its own ports, and on the local isolated platform
the network namespace it runs in. With the site's directories (``actors/<site>/`` its home and TLS leaf,
``admin/<site>/`` its identity, signed policy and CA, ``audit/<site>/`` its audit log, ``stores/<site>/`` its
store's objects) it is everything ``insitu site up`` reads (``site_runtime``). ``insitu up`` writes each site's kit
from the operator's state and starts each site from it, by the same code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from deployments.platform.endpoints import Endpoints
from deployments.platform.errors import PlatformError
from deployments.platform.state import PlatformState

KIT_FORMAT = 1
# A site's own directories under a root (the operator's state directory, or the site host's copy of it).
SITE_DIRS = ("actors/{site}", "admin/{site}", "audit/{site}", "stores/{site}", "sites/{site}.json")


def kit_file(root: Path, site: str) -> Path:
    return root / "sites" / f"{site}.json"


def run_file(root: Path, site: str) -> Path:
    """Where ``insitu site up`` records the PIDs it started (on the operator's machine: its state file does)."""
    return root / "sites" / f"{site}.run.json"


def build(state: PlatformState, urls: Endpoints, site: str, root: Path, netns: str | None,
          audit_tag: str | None, separate_users: bool) -> dict[str, Any]:
    """``site``'s kit from the operator's state: its own entries only (``tests/unit/test_site_kit.py``)."""
    secrets = state.data["secrets"]
    s3: dict[str, Any] = {}
    if site in secrets["s3"]:
        s3[site] = secrets["s3"][site]
    if site in secrets["s3"].get("exchange", {}):
        s3["exchange"] = {site: secrets["s3"]["exchange"][site]}
    return {
        "format": KIT_FORMAT,
        "site": site,
        "root": str(root),
        "control_plane": {"host": urls.control_host(site),
                          "ports": {server: urls.crossing_port(site, server) for server in ("prefect", "s3-exchange")}},
        "ports": {f"s3-{site}": state.port(f"s3-{site}"), f"dask-{site}": state.port(f"dask-{site}")},
        "netns": netns,
        "audit_tag": audit_tag,
        "separate_users": separate_users,
        "secrets": {"audit": {site: secrets["audit"][site]}, "audit_signing": {site: secrets["audit_signing"][site]},
                    "prefect_auth": secrets["prefect_auth"], "s3": s3},
    }


def write(path: Path, kit: dict[str, Any]) -> bool:
    """Write the kit (0600) when its content changed; returns whether it did."""
    from insitu.governance.identity import write_private

    if path.is_file() and not path.is_symlink() and json.loads(path.read_text()) == kit:
        return False
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_private(path, json.dumps(kit, indent=2))  # a fresh file renamed over it: a planted link is replaced
    return True


def load(path: Path, site: str) -> dict[str, Any]:
    """The kit at ``path``: refused with the fix when it is missing, another site's or of another format."""
    if not path.is_file():
        raise PlatformError(f"{path}: no kit for site {site!r}. Fix: on the operator's machine run `insitu up` once, "
                            f"then copy the site's files ({', '.join(d.format(site=site) for d in SITE_DIRS)}) to "
                            "this host under the directory given as --state-dir (docs/operations.md)")
    kit: dict[str, Any] = json.loads(path.read_text())
    if kit.get("format") != KIT_FORMAT or kit.get("site") != site:
        raise PlatformError(f"{path}: a kit for site {kit.get('site')!r} in format {kit.get('format')!r}, not site "
                            f"{site!r} in format {KIT_FORMAT}. Fix: copy the kit `insitu up` wrote for {site!r}")
    return kit


class KitEndpoints(Endpoints):
    """A site's addresses from its kit alone: the control plane where the kit says the site reaches it (the ports
    across its border), its own store and Dask scheduler on its own loopback."""

    def __init__(self, state: PlatformState, kit: dict[str, Any]) -> None:
        super().__init__(state)
        self._cp = kit["control_plane"]
        self.net = _KitNet(kit["netns"]) if kit.get("netns") else None  # type: ignore[assignment]

    def control_host(self, actor: str | None) -> str:
        return str(self._cp["host"])

    def crossing_port(self, actor: str | None, server: str) -> int:
        return int(self._cp["ports"][server])


class _KitNet:
    """The one namespace a kit names (the site's own, on the local isolated platform)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def ns(self, who: str) -> str:
        return self.name
