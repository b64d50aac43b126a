"""The local multi-site platform: every server and worker of the product, on 127.0.0.1 or (``--isolated``) with the
control plane and each site on a network of its own (``netns``).

``Platform(state_dir).up()`` starts (or reuses) a Prefect server (authentication on), MLflow (basic auth: only the
coordinator writes the registry), one S3 endpoint per site and one for the exchange (moto with IAM: each site its own
bucket and its own prefixes of the exchange), a Dask scheduler and workers per site (mutual TLS, the site's own CA),
the locked work pools and one insitu worker per pool (``deployments/worker.py``). Each site is an *actor* with a
home ``actors/<site>/`` (its TLS leaf, temporary files) and a root of trust ``admin/<site>/`` (identity, signed
policy, CA) owned by its admin; its audit log lives with its audit service (``insitu-audit``). As root each actor runs
as its own OS user in a 0700 home. The state file (ports, PIDs, every credential) is root's, 0600, never handed to a
site. ``down()`` stops exactly the processes ``up()`` recorded, by PID, and removes the namespaces it made.

``Platform`` is the operator's one handle on it (CLI and tests); one module per job does the work: ``paths``,
``state``, ``env``, ``components``, ``processes``, ``layout``, ``provision``, ``principals``, ``border``, ``netns``.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from deployments.platform.actors import COORDINATOR, Actors
from deployments.platform.border import Borders
from deployments.platform.components import Components
from deployments.platform.endpoints import Endpoints
from deployments.platform.env import Environments
from deployments.platform.errors import PlatformError
from deployments.platform.health import prefect_headers, site_security
from deployments.platform.layout import Layout
from deployments.platform.netns import NetPlan, choose_network, entered
from deployments.platform.paths import REPO, PlatformPaths
from deployments.platform.principals import Principals
from deployments.platform.processes import Component, Processes
from deployments.platform.provision import Provisioning
from deployments.platform.state import PlatformState
from deployments.platform.users import Account, can_isolate
from insitu.conf import SitesConfig, load_sites

__all__ = ["COORDINATOR", "REPO", "Platform", "PlatformError"]

log = logging.getLogger(__name__)


class Platform:
    """Start, reuse, inspect and stop the local platform rooted at ``state_dir``."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str] = ".insitu",
        conf_dir: str | os.PathLike[str] | None = None,
        ports: dict[str, int] | None = None,
        free_ports: bool = False,
        isolate_users: bool | None = None,
        database: str | None = None,
        wan: dict[str, dict[str, float] | None] | None = None,
        isolated: bool | None = None,
    ) -> None:
        self.dir = Path(state_dir).resolve()
        self.conf_dir = Path(conf_dir or REPO / "conf").resolve()
        self.sites: SitesConfig = load_sites(self.conf_dir / "sites.yaml")
        self._paths = PlatformPaths(self.dir)
        self._state = PlatformState.open(self._paths.state_file, self.sites, [COORDINATOR, *self.sites.names],
                                         ports, free_ports, database)
        self._processes = Processes(self._state, self._paths)
        isolate = can_isolate() if isolate_users is None else isolate_users
        if isolate and not can_isolate():
            raise PlatformError("separate OS users per site need root; run as root or pass isolate_users=False")
        running = [n for n in self._state.data.get("pids", {}) if self._processes.is_ours(n)]
        self._net = choose_network(self._state.data, self.dir, self.sites.names, isolated, isolate, running)
        self.network: NetPlan | None = self._net  # the isolated platform's namespaces and addresses (None: one network)
        if self._net is not None:  # each audit service on an abstract socket, in its actor's namespace
            self._paths = PlatformPaths(self.dir, abstract_audit=self._net.tag)
        self._actors = Actors(self.sites, isolate)
        self._borders = Borders(self.sites, self._state, self._paths.root / "wan",
                                self._net.control_address if self._net else lambda site: "127.0.0.1")
        self._borders.record(wan or {})
        self._urls = Endpoints(self._state, self._borders, self._net)
        self._principals = Principals(self._paths, self.sites)
        self._envs = Environments(self._paths, self.sites, self.conf_dir, self._state, self._urls,
                                  self._actors.account)
        self._components = Components(self._paths, self.sites, self._actors, self._state, self._urls, self._envs,
                                      self._borders)
        self._layout = Layout(self._paths, self._actors, self._principals, self._state)
        self._provisioning = Provisioning(self._paths, self.sites, self._actors, self._state, self._urls)

    def within(self, actor: str | None) -> AbstractContextManager[None]:
        """Run the body inside ``actor``'s network namespace on an isolated platform (the coordinator's and the
        servers' is the control plane's; None: the host); a no-op on one network."""
        return entered(self._components.netns(actor)) if actor is not None else nullcontext()

    # ------------------------------------------------------------------ lifecycle
    def up(self) -> dict[str, Any]:
        """Start whatever is not running; wait until every component is healthy. Idempotent."""
        self._refuse_an_older_platform()
        t0 = time.monotonic()
        if self._net is not None:
            self._state.save()  # the plan is on record before anything of it exists
            self._net.create()
        self._layout.prepare_dirs()
        self._state.save()  # before initdb: the superuser's password must be on record once the cluster has it
        self._layout.prepare_database()
        self._provisioning.mlflow_auth_config(self._components.mlflow_auth_uri())
        self._state.save()
        self._layout.prepare_audit()
        started = self._processes.ensure(self._components.audit([COORDINATOR]))
        started += self._processes.ensure(self._components.database())
        with self.within(COORDINATOR):  # PostgreSQL listens inside the control plane only
            self._provisioning.databases()
        servers = self._components.control_servers()
        started += self._processes.ensure(servers)
        self._provision_started(servers, started)
        self._follow_borders(started)
        self._provisioning.pools()
        started += self._processes.ensure(self._components.workers([COORDINATOR]))
        for site in self.sites.names:  # each region from its own kit, by the code `insitu site up` runs
            started += self._site_up(site)
        elapsed = time.monotonic() - t0
        log.info("platform up in %.1fs (started: %s)", elapsed, ", ".join(started) or "nothing, all running")
        return {"seconds": elapsed, "started": started}

    def _site_up(self, site: str) -> list[str]:
        """Write ``site``'s kit from this state and start the site from it (``site_runtime``); a changed kit (new
        exchange keys, a new border) restarts its worker. The operator keeps the store's keys (it seeds, inside)."""
        from deployments.platform import site_kit
        from deployments.platform.site_runtime import SiteRuntime

        kit = site_kit.build(self._state, self._urls, site, self.dir, self._components.netns(site),
                             self._net.tag if self._net else None, self._actors.isolate)
        if site_kit.write(site_kit.kit_file(self.dir, site), kit):
            self._processes.stop([f"worker-{self._actors.work_pool(site)}"])
        runtime = SiteRuntime(self.dir, site, self.conf_dir, self._processes)

        def first_policy() -> None:  # audited: the site's audit service runs from here on
            with self.within(site):
                self._layout.install_default_policy(site)

        started = runtime.up(after_audit=first_policy)
        if site in runtime.kit["secrets"]["s3"]:
            self.state["secrets"]["s3"][site] = runtime.kit["secrets"]["s3"][site]
            self._state.save()
        return started

    def _follow_borders(self, started: list[str]) -> None:
        """Each site's relay runs exactly when it has a WAN profile (a changed profile is re-read by the running
        relay); a site whose border changed gets a new kit, and its worker restarts with it (``_site_up``)."""
        for site in self._borders.write_configs():
            if self._processes.is_ours(f"wan-{site}"):
                os.kill(self.state["pids"][f"wan-{site}"], signal.SIGHUP)
        self._processes.stop([f"wan-{s}" for s in self.sites.names
                              if not self._borders.behind(s) and self._processes.is_ours(f"wan-{s}")])
        started += self._processes.ensure(self._components.borders())

    def _refuse_an_older_platform(self) -> None:
        if self._state.older_running and any(self._processes.is_ours(n) for n in self.state.get("pids", {})):
            raise PlatformError(f"the platform in {self.dir} was started by an older insitu (no authentication, "
                                "one user); stop it with `insitu down`, then start it again")

    def _provision_started(self, servers: list[Component], started: list[str]) -> None:
        """Provision the servers that just started: S3 endpoints issue new keys, MLflow gets its users."""
        started_s3 = [c.extra["s3"] for c in servers if "s3" in c.extra and c.name in started]
        # A store that kept its set-up on disk comes back with the same keys: nothing holding them restarts.
        fresh = [server for server in started_s3 if not self._provisioning.s3_restored(server)]
        for server in fresh:
            self._provisioning.s3(server)
        if fresh:  # the exchange issued new keys: the coordinator's worker restarts with them (a site's, with its kit)
            self._processes.stop([f"worker-{self._actors.work_pool(COORDINATOR)}"])
        if "mlflow-server" in started:
            self._provisioning.mlflow_users()
        self._state.save()

    def status(self) -> dict[str, dict[str, Any]]:
        ours = self._processes.is_ours
        return {c.name: {"pid": self._processes.pid(c.name), "running": ours(c.name),
                         "healthy": ours(c.name) and c.is_healthy()} for c in self._components.all()}

    def down(self, timeout: float = 15.0, site: str | None = None) -> list[str]:
        """Stop every process ``up`` recorded (workers first), and their children, or ``site``'s alone (the rest
        keeps running). Returns their names."""
        if site is not None:
            return self._processes.stop([c.name for tier in self._components.site(site) for c in tier], timeout)
        stopped = self._processes.stop(list(self.state.get("pids", {})), timeout)
        self.state.update(pids={}, started={})
        self._state.save()
        if self._net is not None:  # its namespaces and links go too (kept on record: the next `up` makes the same)
            stopped += [f"netns {n}" for n in self._net.delete()]
        return stopped

    def wipe(self) -> None:
        """Delete the platform's state directory: every store's objects, Prefect's and MLflow's databases and
        artifacts, the audit logs, the keys. Only a stopped platform, and only a directory that holds one."""
        import shutil

        running = [n for n in self.state.get("pids", {}) if self._processes.is_ours(n)]
        if running:
            raise PlatformError(f"the platform in {self.dir} is running ({', '.join(running)}): `insitu down` first")
        if not self.state_file.is_file():
            raise PlatformError(f"{self.dir} holds no platform (no {self.state_file.name}): nothing wiped")
        shutil.rmtree(self.dir)

    def apply_env(self, env: dict[str, str] | None = None) -> None:
        """Put the operator's environment into this process (CLI and tests)."""
        os.environ.update(env or self.operator_env())

    @property
    def database(self) -> str:
        """Where the control plane (Prefect, MLflow) keeps its state: ``postgres`` or ``sqlite``."""
        return self._state.database

    def database_password(self, role: str) -> str:
        """The password of ``role`` on the control plane's PostgreSQL (``superuser``, ``prefect``, ``mlflow``)."""
        return self._state.database_password(role)

    @property
    def borders(self) -> Borders:
        """Each site's border to the control plane: its WAN profile, and cut / restore / set on a running relay."""
        return self._borders

    @property
    def isolate(self) -> bool:
        """Does each actor run as its own OS user (root only)?"""
        return self._actors.isolate

    # ------------------------------------------------------------------ state and secrets
    @property
    def state(self) -> dict[str, Any]:
        """The state file's content: ports, PIDs and every credential (the operator's copy)."""
        return self._state.data

    @state.setter
    def state(self, value: dict[str, Any]) -> None:
        self._state.data = value

    @property
    def state_file(self) -> Path:
        return self._paths.state_file

    @property
    def prefect_auth(self) -> str:
        return self._state.prefect_auth

    def _prefect_headers(self) -> dict[str, str]:
        return prefect_headers(self.prefect_auth)

    def mlflow_password(self, user: str) -> str:
        return self._state.mlflow_password(user)

    def audit_key(self, actor: str) -> bytes:
        return self._state.audit_key(actor)

    def audit_service_keys(self) -> dict[str, str]:
        """Each actor's audit service's Ed25519 public key (hex): only anchors signed by it count."""
        from insitu.governance.anchor_signing import public_hex

        return {a: public_hex(self._state.audit_signing_key(a)) for a in self.actors}

    def s3_credentials(self, server: str, user: str) -> tuple[str, str]:
        """The (access key, secret) IAM issued to ``user`` on ``server``'s endpoint (a site or 'exchange')."""
        return self._state.s3_credentials(server, user)

    def storage_options(self, server: str, user: str) -> dict[str, Any]:
        """s3fs options for ``user`` on ``server``'s endpoint (tests and the operator)."""
        key, secret = self.s3_credentials(server, user)
        return {"key": key, "secret": secret, "skip_instance_cache": True,
                "client_kwargs": {"endpoint_url": self.s3_endpoint(server)}}

    # ------------------------------------------------------------------ actors and where their files live
    @property
    def actors(self) -> list[str]:
        return self._actors.names

    def account(self, actor: str) -> Account:
        """The OS user an actor's processes run as (its own when isolated, else the caller)."""
        return self._actors.account(actor)

    def audit_account(self) -> Account:
        """The OS user the audit services run as: no actor's processes can read the keys or touch the logs."""
        return self._actors.audit_account()

    def work_pool(self, actor: str) -> str:
        return self._actors.work_pool(actor)

    def actor_home(self, actor: str) -> Path:
        return self._paths.actor_home(actor)

    def identity_file(self, actor: str) -> Path:
        return self._paths.identity_file(actor)

    def policy_file(self, site: str) -> Path:
        return self._paths.policy_file(site)

    def policy_record(self, site: str) -> Path:
        """The newest policy version ``site`` accepted (its admin's record)."""
        return self._paths.policy_record(site)

    def admin_dir(self, actor: str) -> Path:
        """The actor's root of trust: identity, policy, record, CA; its admin's."""
        return self._paths.admin_dir(actor)

    def ca_dir(self, site: str) -> Path:
        return self._paths.ca_dir(site)

    def admin_account(self, actor: str) -> Account:
        """The OS user that owns the actor's root of trust (``insitu-<actor>-admin`` when isolated)."""
        return self._actors.admin_account(actor)

    def tls_dir(self, site: str) -> Path:
        return self._paths.tls_dir(site)

    @property
    def audit_dir(self) -> Path:
        """The audit services' own directory: each actor's log and key, readable only by ``insitu-audit``."""
        return self._paths.audit_dir

    def audit_log(self, actor: str) -> Path:
        return self._paths.audit_log(actor)

    def audit_socket(self, actor: str) -> Path:
        return self._paths.audit_socket(actor)

    @property
    def principals_dir(self) -> Path:
        """The demo principals' key pairs: the caller's, never an actor's (a site cannot sign as a person)."""
        return self._paths.principals_dir

    def principal_key_file(self, name: str) -> Path:
        return self._paths.principal_key_file(name)

    @property
    def approvals_dir(self) -> Path:
        """Standing approvals the coordinator may use for UI and scheduled runs (signed, not secret)."""
        return self._paths.approvals_dir

    def dask_security(self, site: str) -> Any:
        """The ``distributed.security.Security`` of ``site``'s own processes (operator and tests)."""
        return site_security(self.tls_dir(site))

    # ------------------------------------------------------------------ principals and policies
    def principal_roles(self) -> dict[str, list[str]]:
        """The local platform's principals: a data scientist, an operator, an auditor and one admin per site."""
        return self._principals.roles()

    def site_admins(self, site: str) -> dict[str, str]:
        """The site's root of trust for its policy: its admins' public keys (in its identity file)."""
        return self._principals.site_admins(site)

    def default_policy(self, site: str, version: int = 1) -> str:
        """The site's first policy, signed by its admin: alice may train fraud detection (see DEFAULT_CEDAR)."""
        return self._principals.default_policy(site, version)

    def install_policy(self, site: str, signed_policy: str) -> None:
        """Install a signed policy as the site's admin (see ``admin``): refused and audited unless signed by a
        site admin for this site with a version above the one it accepted (``policy.version-only-grows``)."""
        with self.within(site):
            self._layout.install_policy(site, signed_policy)

    # ------------------------------------------------------------------ addresses
    def port(self, name: str) -> int:
        return self._urls.port(name)

    @property
    def prefect_api_url(self) -> str:
        return self._urls.prefect_api_url

    @property
    def prefect_ui_url(self) -> str:
        return self._urls.prefect_ui_url

    @property
    def mlflow_url(self) -> str:
        return self._urls.mlflow_url

    def s3_endpoint(self, owner: str) -> str:
        return self._urls.s3_endpoint(owner)

    def dask_address(self, site: str) -> str:
        return self._urls.dask_address(site)

    # ------------------------------------------------------------------ environments (see ``env``)
    def site_env(self, site: str) -> dict[str, str]:
        """The whole environment of one site's worker: its own store, its own keys to the exchange, nothing else."""
        return self._envs.site(site)

    def dask_env(self, site: str) -> dict[str, str]:
        """A site's Dask scheduler and workers read that site's store only."""
        return self._envs.dask(site)

    def coordinator_env(self) -> dict[str, str]:
        return self._envs.coordinator()

    def operator_env(self) -> dict[str, str]:
        """The local operator (CLI, tests): seeds each site's store with that site's keys, reads the
        exchange with the coordinator's, reads MLflow (never writes it), and reaches the Prefect API."""
        return self._envs.operator()
