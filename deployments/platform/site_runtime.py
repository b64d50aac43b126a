"""One region's processes, started from what the region holds (``insitu site up|down|status --site X``).

A :class:`SiteRuntime` reads the site's kit (``site_kit``) and the site's own directories under ``root``, and
``sites.yaml``; never the operator's state file nor another site's files. It starts the site's audit service, its
store's S3 endpoint (whose IAM issues the store's keys on first start, kept in the kit), its Dask scheduler and
workers and its insitu worker, each as the site's OS user and, on the local isolated platform, in the site's network
namespace. ``insitu up`` starts every site through this same class (recording the PIDs in its state file); on a
site's own host ``insitu site up`` records them beside the kit (``sites/<site>.run.json``).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deployments.platform import site_kit
from deployments.platform.actors import Actors
from deployments.platform.border import Borders
from deployments.platform.components import Components
from deployments.platform.env import Environments
from deployments.platform.errors import PlatformError
from deployments.platform.health import tcp_ok
from deployments.platform.layout import write_audit_config
from deployments.platform.netns import NETNS_DIR, entered
from deployments.platform.paths import PlatformPaths
from deployments.platform.processes import Component, Processes
from deployments.platform.provision import Provisioning
from deployments.platform.state import PlatformState
from deployments.platform.users import current_account, make_private_dir
from insitu.conf import load_sites


class SiteRuntime:
    """Start, inspect and stop one site from its kit under ``root`` (``processes``: whose record keeps the PIDs;
    default the site's own ``sites/<site>.run.json``)."""

    def __init__(self, root: str | os.PathLike[str], site: str, conf_dir: str | os.PathLike[str],
                 processes: Processes | None = None) -> None:
        self.root = Path(root).resolve()
        self.site = site
        sites = load_sites(Path(conf_dir) / "sites.yaml")
        if site not in sites.names:
            raise PlatformError(f"site {site[:40]!r} is not in {Path(conf_dir) / 'sites.yaml'} (sites: "
                                f"{', '.join(sites.names)})")
        path = site_kit.kit_file(self.root, site)
        self.kit = site_kit.load(path, site)
        self._state = PlatformState(path, self.kit)  # the kit is the site's whole state: its own secrets only
        self._paths = PlatformPaths(self.root, abstract_audit=self.kit.get("audit_tag"))
        self._actors = Actors(sites, bool(self.kit["separate_users"]))
        self._urls = site_kit.KitEndpoints(self._state, self.kit)
        envs = Environments(self._paths, sites, Path(conf_dir).resolve(), self._state, self._urls,
                            self._actors.account)
        # Its border's relay runs in the control plane: the kit's ports already cross it.
        self._components = Components(self._paths, sites, self._actors, self._state, self._urls, envs,
                                      Borders(sites, self._state, self._paths.root / "wan"))
        self._provisioning = Provisioning(self._paths, sites, self._actors, self._state, self._urls)
        self._run = self._record() if processes is None else None  # None: the caller's record keeps the PIDs
        self._processes = processes or Processes(self._run, self._paths)  # type: ignore[arg-type]

    def _record(self) -> PlatformState:
        path = site_kit.run_file(self.root, self.site)
        data: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
        return PlatformState(path, {"pids": data.get("pids", {}), "started": data.get("started", {})})

    @property
    def components(self) -> list[Component]:
        return [c for tier in self._components.site(self.site) for c in tier]

    def env(self) -> dict[str, str]:
        """The environment of the site's worker, as built from the kit."""
        return self._components.workers([self.site])[0].env

    def up(self, after_audit: Callable[[], None] | None = None) -> list[str]:
        """Start whatever of the site is not running, tier by tier, until healthy; returns what was started.
        ``after_audit``: what the operator does once the site's audit service runs (install its first policy)."""
        self._check_place()
        audit, store, dask, worker = self._components.site(self.site)
        write_audit_config(self._paths, self._actors, self._state, self.site)
        started = self._processes.ensure(audit)
        if after_audit is not None:
            after_audit()
        started += self._processes.ensure(store)
        if store[0].name in started and not self._provisioning.s3_restored(self.site):
            with entered(self.kit.get("netns")):  # its store's keys: issued on first start, kept in the kit
                self._provisioning.s3(self.site)
            self._processes.stop([c.name for c in dask + worker])  # they hold the old keys
            dask, worker = self._components.site(self.site)[2:]
        started += self._processes.ensure(dask)
        started += self._processes.ensure(worker)
        return started

    def _check_place(self) -> None:
        """Refuse to start where the kit cannot run: a namespace that does not exist, a store port already served
        by someone else (the site running already, from another directory)."""
        ns = self.kit.get("netns")
        if ns and not os.path.exists(f"{NETNS_DIR}/{ns}"):
            raise PlatformError(f"the kit of {self.site} runs in network namespace {ns}, which does not exist: start "
                                "the isolated platform first (`insitu up --isolated`), or use a kit written without it")
        if self._run is not None:
            make_private_dir(self.root, current_account(), 0o711)  # the site's users pass through to their homes
            make_private_dir(self.root / "logs", current_account(), 0o700)
        store = f"s3-{self.site}"
        with entered(ns):
            taken = not self._processes.is_ours(store) and tcp_ok(self._state.port(store))
        if taken:
            raise PlatformError(f"{self.site}'s store port {self._state.port(store)} is already served: the site runs "
                                "already (from the operator's `insitu up`, or another copy). Stop that first")

    def down(self, timeout: float = 15.0) -> list[str]:
        """Stop the site's processes this record started."""
        stopped = self._processes.stop([c.name for c in self.components], timeout)
        if self._run is not None:
            self._run.data.update(pids={}, started={})
            self._run.save()
        return stopped

    def status(self) -> dict[str, dict[str, Any]]:
        out = {}
        for c in self.components:
            running = self._processes.is_ours(c.name)
            out[c.name] = {"pid": self._processes.pid(c.name), "running": running,
                           "healthy": running and c.is_healthy()}
        return out

    def reach_control_plane_at(self, host: str) -> None:
        """Where this site reaches the control plane from its own host (kept in its kit): an address or a name."""
        if not host or any(c in host for c in "/: @"):
            raise PlatformError(f"--control-plane {host[:60]!r}: give a host name or address only (the ports are the "
                                "kit's: control_plane.ports)")
        self.kit["control_plane"]["host"] = host
        site_kit.write(site_kit.kit_file(self.root, self.site), self.kit)

    def relocate(self) -> bool:
        """A kit copied to another directory: point the site's identity at its files here (as the site's admin
        would on its own host). Returns whether anything moved."""
        old = self.kit["root"]
        if old == str(self.root):
            return False
        ident = self._paths.identity_file(self.site)
        admin = self._actors.admin_account(self.site)
        # Read through one descriptor that is not a link, of a file the site's admin owns: nothing swapped in between
        # can make root copy another file into the identity.
        fd = os.open(ident, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid not in (admin.uid, 0):
                raise PlatformError(f"{ident} is not a regular file of {admin.name}: refusing to relocate it")
            raw = json.loads(f.read())
        for key in ("audit_log", "policy", "audit_socket"):
            if isinstance(raw.get(key), str) and raw[key].startswith(old + "/"):
                raw[key] = str(self.root) + raw[key][len(old):]
        from insitu.governance.identity import write_private

        write_private(ident, json.dumps(raw, indent=2), st.st_uid, st.st_gid, st.st_mode & 0o777)
        self.kit["root"] = str(self.root)
        site_kit.write(site_kit.kit_file(self.root, self.site), self.kit)
        return True
