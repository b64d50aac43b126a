"""The local multi-site platform: every server and worker of the product, on 127.0.0.1.

``Platform(state_dir).up()`` starts (or reuses) a Prefect server (authentication on), an MLflow
tracking server (its basic-auth app: only the coordinator's service account writes the registry), one
S3 endpoint per site plus one for the exchange (moto in server mode with IAM authentication: one IAM
user per site, allowed only its own bucket and its own prefixes of the exchange), a Dask scheduler with
workers per site (mutual TLS with the site's own CA), the work pools (locked job templates), and one
insitu worker per pool (``deployments/worker.py``) that refuses runs carrying overrides.

Each site is an *actor* with a home ``actors/<site>/`` holding its identity file, TLS keys, signed site
policy and temporary files; its audit log and key live in ``audit/<actor>/`` with its audit service, which
runs as ``insitu-audit`` (``insitu.governance.audit_service``). When the platform runs as root each actor's
processes run as its own OS user ``insitu-<actor>`` and its home is 0700, so a site's process can read only
its own secrets. The state file (ports, PIDs, every credential: the operator's copy) is root's, 0600, and
its directory is never handed to a site process. ``down()`` stops exactly the processes ``up()`` recorded, by PID.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from deployments.platform.users import (
    Account,
    can_isolate,
    current_account,
    ensure_account,
    ensure_traversable,
    make_private_dir,
)
from insitu.conf import SitesConfig, load_sites
from insitu.governance.approvals import ENV_APPROVALS
from insitu.governance.identity import ENV_IDENTITY, Identity, write_private

log = logging.getLogger(__name__)

# deployments/platform/supervisor.py → the checkout: conf/, and the working directory of every component.
REPO = Path(__file__).resolve().parents[2]
DEFAULT_PORTS = {"prefect": 4200, "mlflow": 5055, "s3-exchange": 9100}
STATE_FORMAT = 2
_BASE_ENV = ("PATH", "LANG", "LC_ALL", "SHELL")
COORDINATOR = "coordinator"


class PlatformError(RuntimeError):
    """A component of the local platform did not start or is not healthy."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (loopback only)
            return 200 <= r.status < 500
    except Exception:
        return False


def _tcp_ok(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int | None, created: float | None = None) -> bool:
    """Is ``pid`` running, and (when ``created`` is known) still the process we started, not a reuse?"""
    if not pid:
        return False
    try:
        p = psutil.Process(pid)
        if created is not None and abs(p.create_time() - created) > 1.0:
            return False
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _bin(name: str) -> str:
    """A console script of this virtualenv (the one running us), else from PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


@dataclass
class Component:
    name: str
    command: list[str]
    env: dict[str, str]
    healthy: Callable[[], bool]
    timeout: float = 90.0
    account: Account | None = None  # run as this OS user (None: as the caller)
    extra: dict[str, Any] = field(default_factory=dict)


class Platform:
    """Start, reuse, inspect and stop the local platform rooted at ``state_dir``."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str] = ".insitu",
        conf_dir: str | os.PathLike[str] | None = None,
        ports: dict[str, int] | None = None,
        free_ports: bool = False,
        isolate_users: bool | None = None,
    ) -> None:
        self.dir = Path(state_dir).resolve()
        self.conf_dir = Path(conf_dir or REPO / "conf").resolve()
        self.sites: SitesConfig = load_sites(self.conf_dir / "sites.yaml")
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self.state = self._load_state()
        self._older_running = False
        if self.state.get("format") != STATE_FORMAT:
            # A platform from an older insitu: keep what `down` needs to stop it, start afresh otherwise.
            self._older_running = any(_alive(pid) for pid in self.state.get("pids", {}).values())
            self.state = {k: self.state[k] for k in ("pids", "started", "ports") if k in self.state} \
                if self._older_running else {}
        self.state["format"] = STATE_FORMAT
        if not self.state.get("ports"):
            self.state["ports"] = self._choose_ports(ports or {}, free_ports)
        elif ports:
            self.state["ports"].update(ports)
        if not self.state.get("secrets"):
            self.state["secrets"] = self._new_secrets()
        self.isolate = can_isolate() if isolate_users is None else isolate_users
        if self.isolate and not can_isolate():
            raise PlatformError("separate OS users per site need root; run as root or pass isolate_users=False")

    # ------------------------------------------------------------------ state
    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    def _load_state(self) -> dict[str, Any]:
        if self.state_file.exists():
            return json.loads(self.state_file.read_text())
        return {}

    def _save_state(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(self.state, indent=2))
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.state_file)

    def _choose_ports(self, given: dict[str, int], free: bool) -> dict[str, int]:
        names = ["prefect", "mlflow", "s3-exchange"]
        names += [f"s3-{s.name}" for s in self.sites.sites] + [f"dask-{s.name}" for s in self.sites.sites]
        defaults = dict(DEFAULT_PORTS)
        for i, s in enumerate(self.sites.sites):
            defaults[f"s3-{s.name}"] = 9101 + i
            defaults[f"dask-{s.name}"] = 8701 + i
        return {n: given.get(n) or (free_port() if free else defaults[n]) for n in names}

    def _new_secrets(self) -> dict[str, Any]:
        """Secrets the platform chooses itself; S3 keys are issued by each endpoint's IAM when it starts."""
        return {
            "audit": {a: secrets.token_hex(32) for a in self.actors},
            "prefect_auth": f"insitu:{secrets.token_urlsafe(24)}",
            "mlflow": {u: secrets.token_urlsafe(18) for u in ("admin", COORDINATOR, "operator", "flask-secret")},
            "s3": {},
        }

    # ------------------------------------------------------------------ actors
    @property
    def actors(self) -> list[str]:
        return [COORDINATOR, *self.sites.names]

    def account(self, actor: str) -> Account:
        """The OS user an actor's processes run as (its own when isolated, else the caller)."""
        return ensure_account(f"insitu-{actor}") if self.isolate else current_account()

    def actor_home(self, actor: str) -> Path:
        return self.dir / "actors" / actor

    def identity_file(self, actor: str) -> Path:
        return self.actor_home(actor) / "identity.json"

    def work_pool(self, actor: str) -> str:
        return self.sites.coordinator.work_pool if actor == COORDINATOR else self.sites.site(actor).work_pool

    # ------------------------------------------------------------------ audit services
    @property
    def audit_dir(self) -> Path:
        """The audit services' own directory: each actor's log and key, readable only by ``insitu-audit``."""
        return self.dir / "audit"

    def audit_account(self) -> Account:
        """The OS user the audit services run as: no actor's processes can read the keys or touch the logs."""
        return ensure_account("insitu-audit") if self.isolate else current_account()

    def audit_log(self, actor: str) -> Path:
        return self.audit_dir / actor / f"{actor}.jsonl"

    def audit_socket(self, actor: str) -> Path:
        return self.audit_dir / f"{actor}.sock"

    def _prepare_audit(self) -> None:
        """Each actor's audit directory and service configuration (key, log, socket, the one uid it serves)."""
        acct = self.audit_account()
        make_private_dir(self.audit_dir, acct, 0o711)  # actors may reach their socket, not list or read
        for actor in self.actors:
            d = make_private_dir(self.audit_dir / actor, acct, 0o700)
            spec = {"actor": actor, "log": str(self.audit_log(actor)), "key": self.audit_key(actor).hex(),
                    "socket": str(self.audit_socket(actor)), "allowed_uids": [self.account(actor).uid]}
            write_private(d / "service.json", json.dumps(spec), *((acct.uid, acct.gid) if os.geteuid() == 0 else ()))

    def _audit_components(self) -> list[Component]:
        from insitu.governance.audit_service import AuditClient

        def healthy(actor: str) -> bool:
            try:
                return AuditClient(self.audit_socket(actor), actor, self.audit_log(actor)).head() is not None
            except Exception:
                return False

        return [Component(f"audit-{a}", [sys.executable, "-m", "insitu.governance.audit_service", "--config",
                                         str(self.audit_dir / a / "service.json")],
                          self._base_env(), lambda a=a: healthy(a), timeout=60, account=self.audit_account())
                for a in self.actors]

    # ------------------------------------------------------------------ principals and policies
    @property
    def principals_dir(self) -> Path:
        """The demo principals' key pairs: the caller's, never an actor's (a site cannot sign as a person)."""
        return self.dir / "principals"

    @property
    def approvals_dir(self) -> Path:
        """Standing approvals the coordinator may use for UI and scheduled runs (signed, not secret)."""
        return self.dir / "approvals"

    def principal_roles(self) -> dict[str, list[str]]:
        """The local platform's principals: a data scientist, an operator, an auditor and one admin per site."""
        roles = {"alice": ["data-scientist"], "operator": ["coordinator-operator"], "auditor": ["auditor"]}
        roles.update({f"{s}-admin": ["site-admin"] for s in self.sites.names})
        return roles

    def principal_keys(self) -> dict[str, str]:
        """Each principal's public key (hex); key pairs are created on first use and kept."""
        from insitu.governance.principals import new_key_pair

        make_private_dir(self.principals_dir, current_account(), 0o700)
        return {name: new_key_pair(self.principals_dir, name) for name in self.principal_roles()}

    def principal_key_file(self, name: str) -> Path:
        return self.principals_dir / f"{name}.key"

    def policy_file(self, site: str) -> Path:
        return self.actor_home(site) / "policy" / "policy.json"

    def site_admins(self, site: str) -> dict[str, str]:
        """The site's root of trust for its policy: its admins' public keys (in its identity file)."""
        keys = self.principal_keys()
        return {f"{site}-admin": keys[f"{site}-admin"]}

    def default_policy(self, site: str, version: int = 1) -> str:
        """The site's first policy, signed by its admin: alice may train fraud detection (see DEFAULT_CEDAR)."""
        from insitu.governance.policy import DEFAULT_CEDAR, PrincipalEntry, SitePolicy, sign_policy
        from insitu.governance.principals import load_private_key

        keys = self.principal_keys()
        policy = SitePolicy(site=site, version=version, issued_at=datetime.now(UTC),
                            principals={n: PrincipalEntry(public_key=keys[n], roles=r)
                                        for n, r in self.principal_roles().items()
                                        if not r == ["site-admin"] or n == f"{site}-admin"},
                            cedar=DEFAULT_CEDAR)
        admin = f"{site}-admin"
        return sign_policy(policy, admin, load_private_key(self.principal_key_file(admin))).model_dump_json(indent=2)

    def install_policy(self, site: str, signed_policy: str) -> None:
        """Install a signed policy in the site's home, written *as the site* (see ``home``)."""
        self._run_home_helper(site, self._identity(site), {"policy_only": True,
                                                            "policy": {"text": signed_policy, "replace": True}})

    def audit_key(self, actor: str) -> bytes:
        return bytes.fromhex(self.state["secrets"]["audit"][actor])

    def tls_dir(self, site: str) -> Path:
        return self.actor_home(site) / "tls"

    def dask_security(self, site: str) -> Any:
        """The ``distributed.security.Security`` of ``site``'s own processes (operator and tests)."""
        from insitu.governance.pki import load_site_pki

        return load_site_pki(self.tls_dir(site)).security()

    # ------------------------------------------------------------------ urls and environments
    def port(self, name: str) -> int:
        return int(self.state["ports"][name])

    @property
    def prefect_api_url(self) -> str:
        return f"http://127.0.0.1:{self.port('prefect')}/api"

    @property
    def prefect_ui_url(self) -> str:
        return f"http://127.0.0.1:{self.port('prefect')}"

    @property
    def prefect_auth(self) -> str:
        return str(self.state["secrets"]["prefect_auth"])

    @property
    def mlflow_url(self) -> str:
        return f"http://127.0.0.1:{self.port('mlflow')}"

    def mlflow_password(self, user: str) -> str:
        return str(self.state["secrets"]["mlflow"][user])

    def s3_endpoint(self, owner: str) -> str:
        return f"http://127.0.0.1:{self.port(f's3-{owner}')}"

    def dask_address(self, site: str) -> str:
        return f"tls://127.0.0.1:{self.port(f'dask-{site}')}"

    def s3_credentials(self, server: str, user: str) -> tuple[str, str]:
        """The (access key, secret) IAM issued to ``user`` on ``server``'s endpoint (a site or 'exchange')."""
        try:
            c = self.state["secrets"]["s3"][server][user]
        except KeyError:
            raise PlatformError(f"no S3 credentials for {user} on {server}'s endpoint: is the platform up?") from None
        return c["access_key"], c["secret_key"]

    def storage_options(self, server: str, user: str) -> dict[str, Any]:
        """s3fs options for ``user`` on ``server``'s endpoint (tests and the operator)."""
        key, secret = self.s3_credentials(server, user)
        return {"key": key, "secret": secret, "skip_instance_cache": True,
                "client_kwargs": {"endpoint_url": self.s3_endpoint(server)}}

    def _base_env(self, actor: str | None = None) -> dict[str, str]:
        """What every process gets; an actor's own home, user and temporary directory when ``actor`` is set."""
        env = {k: os.environ[k] for k in _BASE_ENV if k in os.environ}
        home = self.actor_home(actor) if actor else self.dir
        tmp = home / "tmp"
        env.update(
            {
                "HOME": str(home),
                "USER": self.account(actor).name if actor else current_account().name,
                "PYTHONUNBUFFERED": "1",
                "TMPDIR": str(tmp),
                "AWS_DEFAULT_REGION": "us-east-1",
                "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
                "INSITU_CONF": str(self.conf_dir),
                "DASK_TEMPORARY_DIRECTORY": str(tmp),
                "DASK_DISTRIBUTED__WORKER__DAEMON": "False",
                "MPLCONFIGDIR": str(tmp / "matplotlib"),
            }
        )
        return env

    def _prefect_env(self, actor: str | None = None) -> dict[str, str]:
        home = self.actor_home(actor) / "prefect" if actor else self.dir / "prefect-client"
        return {
            "PREFECT_API_URL": self.prefect_api_url,
            "PREFECT_API_AUTH_STRING": self.prefect_auth,
            "PREFECT_HOME": str(home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PREFECT_WORKER_PREFETCH_SECONDS": "5",
            "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "false",
        }

    def _store_env(self, server: str, user: str) -> dict[str, str]:
        """The variables ``sites.yaml`` names for ``server``'s store, holding ``user``'s own IAM keys."""
        ref = self.sites.exchange if server == "exchange" else self.sites.site(server)
        env: dict[str, str] = {}
        if ref.endpoint_env:
            env[ref.endpoint_env] = self.s3_endpoint(server)
        if server not in self.state["secrets"]["s3"]:
            return env  # not provisioned yet (before up): the endpoint alone
        key, secret = self.s3_credentials(server, user)
        if ref.key_env:
            env[ref.key_env] = key
        if ref.secret_env:
            env[ref.secret_env] = secret
        return env

    def _dask_tls_env(self, site: str) -> dict[str, str]:
        """Dask's own configuration, as variables: every connection of this site's processes is mutual TLS."""
        from insitu.governance.pki import CA_CERT, LEAF_CERT, LEAF_KEY

        d = self.tls_dir(site)
        ca, cert, key = str(d / CA_CERT), str(d / LEAF_CERT), str(d / LEAF_KEY)
        return {
            "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True",
            "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": ca,
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": cert,
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": key,
            "DASK_DISTRIBUTED__COMM__TLS__WORKER__CERT": cert,
            "DASK_DISTRIBUTED__COMM__TLS__WORKER__KEY": key,
            "DASK_DISTRIBUTED__COMM__TLS__SCHEDULER__CERT": cert,
            "DASK_DISTRIBUTED__COMM__TLS__SCHEDULER__KEY": key,
        }

    def site_env(self, site: str) -> dict[str, str]:
        """The whole environment of one site's worker: its own store, its own keys to the exchange, nothing else."""
        s = self.sites.site(site)
        return {
            **self._base_env(site),
            **self._prefect_env(site),
            **self._store_env(site, site),
            **self._store_env("exchange", site),
            **self._dask_tls_env(site),
            s.dask.scheduler_env: self.dask_address(site),
            ENV_IDENTITY: str(self.identity_file(site)),
        }

    def dask_env(self, site: str) -> dict[str, str]:
        """A site's Dask scheduler and workers read that site's store only."""
        # Dask's statistical profiler samples the running thread every 10 ms and takes the GIL to do it:
        # it cost 15-20% of DDP training throughput (bench/ddp_overhead.py).
        return {**self._base_env(site), **self._store_env(site, site), **self._dask_tls_env(site),
                "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False"}

    def coordinator_env(self) -> dict[str, str]:
        return {
            **self._base_env(COORDINATOR),
            **self._prefect_env(COORDINATOR),
            **self._store_env("exchange", COORDINATOR),
            "MLFLOW_TRACKING_URI": self.mlflow_url,
            "MLFLOW_TRACKING_USERNAME": COORDINATOR,
            "MLFLOW_TRACKING_PASSWORD": self.mlflow_password(COORDINATOR),
            ENV_IDENTITY: str(self.identity_file(COORDINATOR)),
            ENV_APPROVALS: str(self.approvals_dir),
        }

    def operator_env(self) -> dict[str, str]:
        """The local operator (CLI, tests): seeds each site's store with that site's keys, reads the
        exchange with the coordinator's, reads MLflow (never writes it), and reaches the Prefect API."""
        env = {**self._base_env(), **self._prefect_env(), **self._store_env("exchange", COORDINATOR)}
        for s in self.sites.names:
            env.update(self._store_env(s, s))
            env[self.sites.site(s).dask.scheduler_env] = self.dask_address(s)
        env.update({"MLFLOW_TRACKING_URI": self.mlflow_url, "MLFLOW_TRACKING_USERNAME": "operator",
                    "MLFLOW_TRACKING_PASSWORD": self.mlflow_password("operator")})
        return env

    # ------------------------------------------------------------------ components
    def _server_components(self) -> list[Component]:
        """The control plane and the clouds' endpoints: run as the caller, never handed to a site."""
        from insitu.governance.iam import no_auth_action_count

        d = self.dir
        base = self._base_env()
        comps = [
            Component(
                "prefect-server",
                [_bin("prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(self.port("prefect")),
                 "--analytics-off"],
                {**base, "PREFECT_HOME": str(d / "prefect-server"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                 "PREFECT_UI_API_URL": self.prefect_api_url, "PREFECT_API_URL": self.prefect_api_url,
                 "PREFECT_SERVER_API_AUTH_STRING": self.prefect_auth},
                lambda: _http_ok(self.prefect_api_url + "/health"),
                timeout=120,
            ),
            Component(
                "mlflow-server",
                [_bin("mlflow"), "server", "--app-name", "basic-auth", "--host", "127.0.0.1",
                 "--port", str(self.port("mlflow")), "--workers", "1",
                 "--backend-store-uri", f"sqlite:///{d / 'mlflow' / 'mlflow.db'}",
                 "--artifacts-destination", str(d / "mlflow" / "artifacts"), "--enable-workspaces"],
                {**base, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
                 "MLFLOW_AUTH_CONFIG_PATH": str(d / "mlflow" / "basic_auth.ini"),
                 "MLFLOW_FLASK_SERVER_SECRET_KEY": self.mlflow_password("flask-secret")},
                lambda: _http_ok(self.mlflow_url + "/health"),
                timeout=120,
            ),
        ]
        for server in ["exchange", *self.sites.names]:
            port = self.port(f"s3-{server}")
            users = len(self._s3_policies(server))
            comps.append(
                Component(f"s3-{server}", [sys.executable, "-m", "deployments.platform.s3", "--port", str(port)],
                          {**base, "INITIAL_NO_AUTH_ACTION_COUNT": str(no_auth_action_count(users))},
                          lambda p=port: _tcp_ok(p), extra={"s3": server})
            )
        return comps

    def _dask_components(self) -> list[Component]:
        comps = []
        for s in self.sites.sites:
            port = self.port(f"dask-{s.name}")
            acct = self.account(s.name)
            comps.append(
                Component(f"dask-scheduler-{s.name}",
                          [_bin("dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port), "--protocol", "tls",
                           # --no-dashboard still serves /health on 0.0.0.0: keep it on loopback too
                           "--no-dashboard", "--dashboard-address", "127.0.0.1:0"],
                          # The scheduler unpickles the task graphs (a rank's TrainSpec holds the training config):
                          # it must import the same checkout as the workers, not whichever one is installed.
                          {**self.dask_env(s.name), "PYTHONPATH": str(REPO)}, lambda p=port: _tcp_ok(p), account=acct)
            )
            comps.append(
                Component(f"dask-workers-{s.name}",
                          [_bin("dask"), "worker", self.dask_address(s.name), "--host", "127.0.0.1",
                           "--nworkers", str(s.dask.local_workers), "--nthreads", "1", "--no-dashboard",
                           "--dashboard-address", "127.0.0.1:0",
                           "--memory-limit", "2GiB", "--local-directory", str(self.actor_home(s.name) / "dask"),
                           "--name", f"{s.name}-worker"],
                          # The checkout on the import path, as for the site's flows (which run from it): a
                          # user's model module kept there (examples/models.py) is importable by every rank.
                          {**self.dask_env(s.name), "PYTHONPATH": str(REPO)},
                          lambda site=s.name, n=s.dask.local_workers: self._dask_workers_ok(site, n), account=acct)
            )
        return comps

    def _components(self) -> list[Component]:
        return self._audit_components() + self._server_components() + self._dask_components()

    def _worker_components(self) -> list[Component]:
        comps = []
        envs = {COORDINATOR: self.coordinator_env(), **{s: self.site_env(s) for s in self.sites.names}}
        for actor, env in envs.items():
            pool = self.work_pool(actor)
            comps.append(
                Component(
                    f"worker-{pool}",
                    [sys.executable, "-m", "deployments.worker", "--pool", pool, "--name", f"{pool}-worker"],
                    env,
                    lambda p=pool: self._worker_online(p),
                    timeout=90,
                    account=self.account(actor),
                )
            )
        return comps

    def _dask_workers_ok(self, site: str, n: int) -> bool:
        from distributed import Client

        try:
            with Client(self.dask_address(site), timeout=3, security=self.dask_security(site)) as c:
                return len(c.scheduler_info(n_workers=-1)["workers"]) >= n
        except Exception:
            return False

    def _prefect_headers(self) -> dict[str, str]:
        import base64

        return {"Authorization": "Basic " + base64.b64encode(self.prefect_auth.encode()).decode()}

    def _worker_online(self, pool: str) -> bool:
        import httpx

        try:
            r = httpx.post(f"{self.prefect_api_url}/work_pools/{pool}/workers/filter", json={}, timeout=3,
                           headers=self._prefect_headers())
            return r.status_code == 200 and any(w.get("status") == "ONLINE" for w in r.json())
        except Exception:
            return False

    # ------------------------------------------------------------------ lifecycle
    def _is_ours(self, name: str) -> bool:
        return _alive(self.state.get("pids", {}).get(name), self.state.get("started", {}).get(name))

    def _start(self, comp: Component) -> None:
        logs = self.dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        out = open(logs / f"{comp.name}.log", "ab")  # noqa: SIM115 (the child owns it)
        as_user: dict[str, Any] = {}
        if comp.account is not None and not comp.account.is_current:
            as_user = {"user": comp.account.uid, "group": comp.account.gid, "extra_groups": []}
        # A new session per component: signals reach it (and only it), and down() can stop its group.
        proc = subprocess.Popen(comp.command, env=comp.env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=str(REPO), start_new_session=True, **as_user)
        out.close()
        self._procs[comp.name] = proc
        self.state.setdefault("pids", {})[comp.name] = proc.pid
        try:
            self.state.setdefault("started", {})[comp.name] = psutil.Process(proc.pid).create_time()
        except psutil.NoSuchProcess:
            pass
        self._save_state()

    def _wait(self, comps: list[Component]) -> None:
        pending = list(comps)
        t0 = time.monotonic()
        while pending:
            for c in list(pending):
                if c.healthy():
                    pending.remove(c)
                elif not self._is_ours(c.name):
                    tail = (self.dir / "logs" / f"{c.name}.log").read_text(errors="replace")[-3000:]
                    raise PlatformError(f"{c.name} exited during startup; its log ends:\n{tail}")
                elif time.monotonic() - t0 > c.timeout:
                    raise PlatformError(
                        f"{c.name} not healthy after {c.timeout:.0f}s; see {self.dir / 'logs' / (c.name + '.log')}"
                    )
            if pending:
                time.sleep(0.3)

    def _ensure(self, comps: list[Component]) -> list[str]:
        started = []
        for c in comps:
            if self._is_ours(c.name):
                continue
            self._start(c)
            started.append(c.name)
        self._wait(comps)
        return started

    def _prepare_dirs(self) -> None:
        """The state directory is root's (others may only pass through); each actor owns its own home."""
        me = current_account()
        make_private_dir(self.dir, me, 0o711)
        for sub in ("logs", "tmp", "mlflow", "mlflow/artifacts", "prefect-server", "prefect-client"):
            make_private_dir(self.dir / sub, me, 0o700)
        make_private_dir(self.dir / "actors", me, 0o711)
        make_private_dir(self.approvals_dir, me, 0o755)  # signed approvals: public, read by the coordinator
        if self.isolate:
            ensure_traversable(self.dir)
            # The site users run this same interpreter (its real home may be under root's own home).
            ensure_traversable(Path(sys.executable).parent)
            ensure_traversable(Path(sys.base_prefix).resolve())
            ensure_traversable(REPO)
        for actor in self.actors:
            self._prepare_home(actor)

    def _prepare_home(self, actor: str) -> None:
        """Create the actor's home (root, in root's ``actors/``), then fill it as the actor (``home``)."""
        acct = self.account(actor)
        home = self.actor_home(actor)
        if home.is_symlink() or (home.exists() and not home.is_dir()):
            raise PlatformError(f"{home} is not a directory; refusing to use it as {actor}'s home")
        home.mkdir(exist_ok=True)
        if self.isolate:
            os.chown(home, acct.uid, acct.gid, follow_symlinks=False)
        home.chmod(0o700)
        ident = self._identity(actor)
        extra: dict[str, Any] = {"with_tls": actor != COORDINATOR}
        if actor != COORDINATOR:  # the platform's default policy, unless the site already has one
            extra["policy"] = {"text": self.default_policy(actor), "replace": False}
        self._run_home_helper(actor, ident, extra)

    def _identity(self, actor: str) -> Identity:
        site = actor != COORDINATOR
        return Identity(actor=actor, role="site" if site else "coordinator",
                        work_pool=self.work_pool(actor), audit_log=self.audit_log(actor),
                        audit_key=None, audit_socket=self.audit_socket(actor), path=self.identity_file(actor),
                        policy=self.policy_file(actor) if site else None,
                        admins=self.site_admins(actor) if site else {})

    def _run_home_helper(self, actor: str, ident: Identity, extra: dict[str, Any]) -> None:
        """Run ``deployments.platform.home`` as the actor (in-process when not isolated), ``extra`` in its spec."""
        home = self.actor_home(actor)
        spec = {"identity": ident.to_json(), "path": str(ident.path), "home": str(home), **extra}
        if not self.isolate:
            from deployments.platform import home as home_helper

            if not spec.get("policy_only"):
                home_helper.prepare_home(home, ident, with_tls=bool(spec.get("with_tls")))
            if spec.get("policy") and ident.policy is not None:
                home_helper.install_policy(ident.policy, spec["policy"]["text"], bool(spec["policy"]["replace"]))
            return
        acct = self.account(actor)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "PYTHONPATH": str(REPO)}
        r = subprocess.run([sys.executable, "-m", "deployments.platform.home"], input=json.dumps(spec), text=True,
                           env=env, cwd="/", capture_output=True, timeout=120, user=acct.uid, group=acct.gid,
                           extra_groups=[])
        if r.returncode != 0:
            raise PlatformError(f"could not prepare {actor}'s home {home} as {acct.name}: {r.stderr[-2000:]}")

    def up(self) -> dict[str, Any]:
        """Start whatever is not running; wait until every component is healthy. Idempotent."""
        if self._older_running and any(self._is_ours(n) for n in self.state.get("pids", {})):
            raise PlatformError(f"the platform in {self.dir} was started by an older insitu (no authentication, "
                                "one user); stop it with `insitu down`, then start it again")
        t0 = time.monotonic()
        self._prepare_dirs()
        self._write_mlflow_auth_config()
        self._save_state()
        self._prepare_audit()
        started = self._ensure(self._audit_components())
        servers = self._server_components()
        started += self._ensure(servers)
        fresh = [c.extra["s3"] for c in servers if "s3" in c.extra and c.name in started]
        for server in fresh:
            self._provision_s3(server)
        if fresh:  # new endpoints issued new keys: processes holding the old ones restart with the new
            self._stop([c.name for c in self._dask_components() + self._worker_components()])
        if "mlflow-server" in started:
            self._provision_mlflow()
        self._save_state()
        started += self._ensure(self._dask_components())
        self._create_pools()
        started += self._ensure(self._worker_components())
        elapsed = time.monotonic() - t0
        log.info("platform up in %.1fs (started: %s)", elapsed, ", ".join(started) or "nothing, all running")
        return {"seconds": elapsed, "started": started}

    # ------------------------------------------------------------------ provisioning
    def _s3_policies(self, server: str) -> dict[str, dict[str, Any]]:
        """IAM user → inline policy on ``server``'s endpoint (the same documents ``docs/iam/`` ships for AWS)."""
        from insitu.governance.iam import exchange_coordinator_policy, exchange_site_policy, site_store_policy

        if server == "exchange":
            bucket = _bucket(self.sites.exchange.storage)
            return {COORDINATOR: exchange_coordinator_policy(bucket),
                    **{s: exchange_site_policy(bucket, s) for s in self.sites.names}}
        return {server: site_store_policy(_bucket(self.sites.site(server).storage))}

    def _provision_s3(self, server: str) -> None:
        """On a just-started endpoint, in its unauthenticated setup window: the bucket, its IAM users and keys."""
        from insitu.governance.iam import provision

        ref = self.sites.exchange if server == "exchange" else self.sites.site(server)
        keys = provision(self.s3_endpoint(server), _bucket(ref.storage), self._s3_policies(server))
        self.state["secrets"]["s3"][server] = {u: {"access_key": k, "secret_key": s} for u, (k, s) in keys.items()}
        self._save_state()

    def _write_mlflow_auth_config(self) -> None:
        from deployments.platform.mlflow_server import write_auth_config

        write_auth_config(self.dir / "mlflow" / "basic_auth.ini", self.dir / "mlflow" / "basic_auth.db",
                          self.mlflow_password("admin"))

    def _provision_mlflow(self) -> None:
        from deployments.platform.mlflow_server import provision_users

        provision_users(self.mlflow_url, self.mlflow_password("admin"),
                        {u: self.mlflow_password(u) for u in (COORDINATOR, "operator")}, writer=COORDINATOR)

    def _create_pools(self) -> None:
        """Create or re-lock the work pools: a fixed job template that no run can vary (no variables)."""
        from deployments.platform.pools import ensure_locked_pool

        for actor in self.actors:
            ensure_locked_pool(self.prefect_api_url, self._prefect_headers(), self.work_pool(actor))

    def status(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for c in self._components() + self._worker_components():
            pid = self.state.get("pids", {}).get(c.name)
            alive = self._is_ours(c.name)
            out[c.name] = {"pid": pid, "running": alive, "healthy": alive and c.healthy()}
        return out

    def down(self, timeout: float = 15.0) -> list[str]:
        """Stop every process ``up`` recorded (workers first), and their children. Returns their names."""
        stopped = self._stop(list(self.state.get("pids", {})), timeout)
        self.state["pids"] = {}
        self.state["started"] = {}
        self._save_state()
        return stopped

    def _stop(self, names: list[str], timeout: float = 15.0) -> list[str]:
        """Stop the named components that are running, with their children: the Prefect workers first, then the
        Dask workers, then the rest (servers). Each tier is signalled at once and waited for together, so a
        component slow to exit costs its tier ``timeout`` once, not every component after it."""
        pids: dict[str, int] = self.state.get("pids", {})
        tiers: dict[int, list[str]] = {}
        for n in names:
            if n in pids:
                tiers.setdefault(0 if n.startswith("worker-") else 1 if n.startswith("dask-workers") else 2,
                                 []).append(n)
        stopped = []
        for tier in sorted(tiers):
            procs: list[psutil.Process] = []
            for name in sorted(tiers[tier]):
                if not self._is_ours(name):
                    continue
                try:
                    procs += [psutil.Process(pids[name]), *psutil.Process(pids[name]).children(recursive=True)]
                except psutil.NoSuchProcess:
                    continue
                stopped.append(name)
            for p in procs:
                try:
                    p.send_signal(signal.SIGTERM)
                except psutil.NoSuchProcess:
                    pass
            _, alive = psutil.wait_procs(procs, timeout=timeout)
            for p in alive:
                log.warning("pid %d still running %.0fs after SIGTERM: killed", p.pid, timeout)
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(alive, timeout=5)
            for name in tiers[tier]:
                if name in self._procs:
                    self._procs[name].wait(timeout=5)
        return stopped

    def apply_env(self, env: dict[str, str] | None = None) -> None:
        """Put the operator's environment into this process (CLI and tests)."""
        os.environ.update(env or self.operator_env())


def _bucket(storage: str) -> str:
    return storage.split("://", 1)[1].split("/", 1)[0]
