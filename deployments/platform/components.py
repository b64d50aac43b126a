"""The processes that make up the local platform, in the tiers ``up`` starts them in.

1. one audit service per actor (``insitu-audit``'s);
2. the control plane's database (PostgreSQL, as ``insitu-postgres``; none when the platform keeps SQLite);
3. the servers, as the caller and never handed to a site: Prefect, MLflow, one S3 endpoint per site and one
   for the exchange;
4. a border relay per site that has a WAN profile (``platform.border``);
5. per site, as the site's user: a Dask scheduler and its workers (mutual TLS with the site's own CA);
6. one insitu worker per work pool (``deployments/worker.py``), as its actor's user.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from deployments.platform import postgres
from deployments.platform.actors import COORDINATOR, Actors
from deployments.platform.border import CROSSING, Borders
from deployments.platform.endpoints import Endpoints
from deployments.platform.env import Environments
from deployments.platform.health import (
    audit_ok,
    dask_workers_ok,
    http_ok,
    prefect_headers,
    tcp_ok,
    worker_online,
)
from deployments.platform.netns import CONTROL
from deployments.platform.paths import REPO, PlatformPaths
from deployments.platform.processes import Component
from deployments.platform.provision import s3_policies
from deployments.platform.state import PlatformState
from insitu.conf import SitesConfig
from insitu.governance.anchors import PREFIX as ANCHORS
from insitu.governance.audit_proof import service_public_hex


def console_script(name: str) -> str:
    """A console script of this virtualenv (the one running us), else from PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


class Components:
    """Each tier's components, built afresh at each call (environments hold the keys recorded so far)."""

    def __init__(self, paths: PlatformPaths, sites: SitesConfig, actors: Actors, state: PlatformState,
                 endpoints: Endpoints, envs: Environments, borders: Borders) -> None:
        self._borders = borders
        self._paths = paths
        self._sites = sites
        self._actors = actors
        self._state = state
        self._urls = endpoints
        self._envs = envs

    def netns(self, actor: str | None) -> str | None:
        """The network namespace ``actor``'s processes run in on an isolated platform: a site's own, the control
        plane's for the coordinator and the servers (``actor`` None); none on one network."""
        net = self._urls.net
        if net is None:
            return None
        return net.ns(CONTROL if actor in (None, COORDINATOR) else actor)  # type: ignore[arg-type]

    def all(self) -> list[Component]:
        """Every component in start order, the workers last."""
        return self.audit() + self.database() + self.servers() + self.borders() + self.dask() + self.workers()

    def site(self, site: str) -> list[list[Component]]:
        """One site's components in the tiers it starts in: its audit service, its store, its Dask, its worker."""
        n = self._sites.site(site).dask.local_workers
        return [self.audit([site]), [self._s3_server(site)],
                [self._dask_scheduler(site), self._dask_workers(site, n)], self.workers([site])]

    def audit(self, actors: list[str] | None = None) -> list[Component]:
        p = self._paths
        return [Component(f"audit-{a}", [sys.executable, "-m", "insitu.governance.audit_service", "--config",
                                         str(p.audit_service_file(a))],
                          self._envs.base(),
                          lambda a=a: audit_ok(p.audit_socket(a), a, p.audit_log(a),
                                               service_public_hex(self._state.audit_signing_key(a))),
                          timeout=60,
                          account=self._actors.audit_account(), netns=self.netns(a))
                for a in (self._actors.names if actors is None else actors)]

    def database(self) -> list[Component]:
        """The control plane's PostgreSQL (none on SQLite): its cluster is created on first start."""
        if self._state.database != "postgres":
            return []
        port = self._urls.port("postgres")
        superuser = self._state.database_password("superuser")
        data = self._paths.postgres_dir / "data"
        account = self._actors.database_account()
        return [Component("postgres", postgres.server_command(data, port),
                          {**self._envs.base(), "HOME": str(self._paths.postgres_dir), "USER": account.name,
                           "TMPDIR": str(self._paths.postgres_dir), "LANG": "C"},
                          lambda: postgres.healthy(port, superuser), timeout=120, account=account,
                          netns=self.netns(None))]

    def servers(self) -> list[Component]:
        """The control plane (run as the caller) and the clouds' endpoints (each its store's own user); never
        handed to a site."""
        return [*self.control_servers(), *(self._s3_server(s) for s in self._sites.names)]

    def control_servers(self) -> list[Component]:
        """The control plane's servers: Prefect, MLflow and the exchange's store."""
        return [self._prefect_server(), self._mlflow_server(), self._s3_server("exchange")]

    def _prefect_server(self) -> Component:
        api = self._urls.prefect_api_url
        return Component(
            "prefect-server",
            [console_script("prefect"), "server", "start", "--host", self._urls.bind_host, "--port",
             str(self._urls.port("prefect")), "--analytics-off"],
            {**self._envs.base(), "PREFECT_HOME": str(self._paths.prefect_server_home),
             "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_API_URL": api, "PREFECT_API_URL": api,
             "PREFECT_SERVER_API_AUTH_STRING": self._state.prefect_auth, **self._prefect_database(),
             # Concurrency leases (a job's hold, tasks.job_lease) on disk in its home: a restart keeps them.
             "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": "prefect.server.concurrency.lease_storage.filesystem",
             # The operator's choice of the server's log level (INFO: its access log, a line per API call, which
             # bench/pipeline_overhead.py counts); Prefect's default otherwise.
             **{k: os.environ[k] for k in ("PREFECT_SERVER_LOGGING_LEVEL",) if k in os.environ}},
            lambda: http_ok(self._urls.prefect_api_url + "/health"),
            timeout=120, netns=self.netns(None),
        )

    def _prefect_database(self) -> dict[str, str]:
        """Where the Prefect server keeps its state: its own PostgreSQL database (the URL, with its password, in its
        environment only: never on a command line), else SQLite in its home."""
        if self._state.database != "postgres":
            return {}
        return {"PREFECT_SERVER_DATABASE_CONNECTION_URL": postgres.url(
            "postgresql+asyncpg", "prefect", self._urls.port("postgres"), "prefect",
            self._state.database_password("prefect"))}

    def mlflow_backend_uri(self) -> str:
        """MLflow's backend store: its own PostgreSQL database (the password comes from ``PGPASSWORD``), else
        SQLite beside its artifacts."""
        if self._state.database != "postgres":
            return f"sqlite:///{self._paths.mlflow_dir / 'mlflow.db'}"
        return postgres.url("postgresql+psycopg2", "mlflow", self._urls.port("postgres"), "mlflow")

    def mlflow_auth_uri(self) -> str:
        """The basic-auth app's users and permissions: a database of their own, like the backend's."""
        if self._state.database != "postgres":
            return f"sqlite:///{self._paths.mlflow_dir / 'basic_auth.db'}"
        return postgres.url("postgresql+psycopg2", "mlflow", self._urls.port("postgres"), "mlflow_auth")

    def _mlflow_server(self) -> Component:
        # Lean: one uvicorn worker and no job runner (the default is ~15 processes and ~3 GB; STACK-NOTES).
        d = self._paths.mlflow_dir
        # libpq reads the role's password from the environment, so no URI (on argv, in the ini) holds it.
        password = {"PGPASSWORD": self._state.database_password("mlflow")} if self._state.database == "postgres" \
            else {}
        return Component(
            "mlflow-server",
            [console_script("mlflow"), "server", "--app-name", "basic-auth", "--host", self._urls.bind_host,
             "--port", str(self._urls.port("mlflow")), "--workers", "1",
             "--backend-store-uri", self.mlflow_backend_uri(),
             "--artifacts-destination", str(d / "artifacts"), "--enable-workspaces"],
            {**self._envs.base(), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
             "MLFLOW_AUTH_CONFIG_PATH": str(self._paths.mlflow_auth_ini),
             "MLFLOW_FLASK_SERVER_SECRET_KEY": self._state.mlflow_password("flask-secret"), **password},
            lambda: http_ok(self._urls.mlflow_url + "/health"),
            timeout=120, netns=self.netns(None),
        )

    def _s3_server(self, server: str) -> Component:
        from insitu.governance.iam import no_auth_action_count

        # moto authenticates every request after its first N, the platform's setup calls (STACK-NOTES).
        port = self._urls.port(f"s3-{server}")
        users = len(s3_policies(self._sites, server))
        # Every object is kept on disk, in the store's own directory (s3_disk); the exchange keeps the audit
        # anchors write-once (s3_keep).
        write_once = ["--write-once", f"{ANCHORS}/"] if server == "exchange" else []
        data, account = self._paths.store_dir(server), self._actors.store_account(server)
        # The exchange serves every border; a site's store its own site alone, on that site's loopback.
        where = None if server == "exchange" else server
        host = self._urls.bind_host if server == "exchange" else "127.0.0.1"
        return Component(f"s3-{server}", [sys.executable, "-m", "deployments.platform.s3", "--host", host,
                                          "--port", str(port), "--data", str(data), *write_once],
                         {**self._envs.base(), "INITIAL_NO_AUTH_ACTION_COUNT": str(no_auth_action_count(users)),
                          "HOME": str(data), "TMPDIR": str(data / "tmp"), "USER": account.name},
                         lambda p=port: tcp_ok(p), extra={"s3": server}, account=account, netns=self.netns(where))

    def borders(self) -> list[Component]:
        """A relay per site that has a WAN profile: its border to the control plane (``platform.border``)."""
        comps = []
        for site in self._borders.sites:
            ports = [self._borders.port(site, server) for server in CROSSING]
            host = self._borders.listen_host(site)
            comps.append(Component(f"wan-{site}", [sys.executable, "-m", "deployments.platform.wan_relay", "--config",
                                                   str(self._borders.config_file(site))],
                                   self._envs.base(), lambda ports=ports, h=host: all(tcp_ok(p, h) for p in ports),
                                   timeout=30, netns=self.netns(None)))
        return comps

    def dask(self) -> list[Component]:
        comps = []
        for s in self._sites.sites:
            comps += [self._dask_scheduler(s.name), self._dask_workers(s.name, s.dask.local_workers)]
        return comps

    def _dask_scheduler(self, site: str) -> Component:
        port = self._urls.port(f"dask-{site}")
        return Component(f"dask-scheduler-{site}",
                         [console_script("dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                          "--protocol", "tls", "--preload", "deployments.platform.dask_pace",
                          # --no-dashboard still serves /health on 0.0.0.0: keep it on loopback too
                          "--no-dashboard", "--dashboard-address", "127.0.0.1:0"],
                         # The scheduler unpickles the task graphs (a rank's TrainSpec holds the training config):
                         # it must import the same checkout as the workers, not whichever one is installed.
                         {**self._envs.dask(site), "PYTHONPATH": str(REPO)}, lambda p=port: tcp_ok(p),
                         account=self._actors.account(site), netns=self.netns(site))

    def _dask_workers(self, site: str, n: int) -> Component:
        address = self._urls.dask_address(site)
        return Component(f"dask-workers-{site}",
                         [console_script("dask"), "worker", address, "--host", "127.0.0.1",
                          "--nworkers", str(n), "--nthreads", "1", "--no-dashboard",
                          "--dashboard-address", "127.0.0.1:0",
                          "--memory-limit", "2GiB", "--local-directory", str(self._paths.actor_home(site) / "dask"),
                          "--name", f"{site}-worker"],
                         # The checkout on the import path, as for the site's flows (which run from it): a
                         # user's model module kept there (examples/models.py) is importable by every rank.
                         {**self._envs.dask(site), "PYTHONPATH": str(REPO)},
                         lambda: dask_workers_ok(self._urls.dask_address(site), self._paths.tls_dir(site), n),
                         account=self._actors.account(site), netns=self.netns(site))

    def workers(self, actors: list[str] | None = None) -> list[Component]:
        """One insitu worker per work pool, each with its actor's environment, as its actor's user."""
        return [self._worker(a, self._envs.coordinator() if a == COORDINATOR else self._envs.site(a))
                for a in (self._actors.names if actors is None else actors)]

    def _worker(self, actor: str, env: dict[str, str]) -> Component:
        pool = self._actors.work_pool(actor)
        return Component(
            f"worker-{pool}",
            [sys.executable, "-m", "deployments.worker", "--pool", pool, "--name", f"{pool}-worker"],
            env,
            lambda: worker_online(self._urls.prefect_api_url_for(actor), prefect_headers(self._state.prefect_auth),
                                  pool),
            timeout=90,
            account=self._actors.account(actor), netns=self.netns(actor),
        )
