"""The local multi-site platform: every server and worker of the product, on 127.0.0.1.

``Platform(state_dir).up()`` starts (or reuses) a Prefect server, an MLflow tracking server, one S3
endpoint per site plus one for the exchange (moto in server mode), a Dask scheduler with workers per
site, the work pools, and one Prefect process worker per pool. Each site's worker and Dask workers
are started with *only that site's* environment: its own store's endpoint and keys, the exchange's,
its Dask scheduler, its audit log and key. The coordinator's worker holds the exchange and MLflow,
and no site's store. ``down()`` stops exactly the processes ``up()`` recorded, by PID.

Everything lives under one state directory (``.insitu/`` by default): ``state.json`` (ports, PIDs,
keys), ``logs/``, the Prefect and MLflow databases, MLflow artifacts, audit logs.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from insitu.config import SitesConfig, load_sites

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_PORTS = {"prefect": 4200, "mlflow": 5055, "s3-exchange": 9100}
_BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "USER", "SHELL")


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


class Platform:
    """Start, reuse, inspect and stop the local platform rooted at ``state_dir``."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str] = ".insitu",
        conf_dir: str | os.PathLike[str] | None = None,
        ports: dict[str, int] | None = None,
        free_ports: bool = False,
    ) -> None:
        self.dir = Path(state_dir).resolve()
        self.conf_dir = Path(conf_dir or REPO / "conf").resolve()
        self.sites: SitesConfig = load_sites(self.conf_dir / "sites.yaml")
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self.state = self._load_state()
        if not self.state.get("ports"):
            self.state["ports"] = self._choose_ports(ports or {}, free_ports)
        elif ports:
            self.state["ports"].update(ports)
        if not self.state.get("secrets"):
            self.state["secrets"] = self._new_secrets()

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
        tmp.write_text(json.dumps(self.state, indent=2))
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

    def _new_secrets(self) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        for owner in ["exchange", "coordinator", *self.sites.names]:
            out[owner] = {
                "access_key": f"{owner}-" + secrets.token_hex(6),
                "secret_key": secrets.token_hex(16),
                "audit_key": secrets.token_hex(32),
            }
        return out

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
    def mlflow_url(self) -> str:
        return f"http://127.0.0.1:{self.port('mlflow')}"

    def s3_endpoint(self, owner: str) -> str:
        return f"http://127.0.0.1:{self.port(f's3-{owner}')}"

    def dask_address(self, site: str) -> str:
        return f"tcp://127.0.0.1:{self.port(f'dask-{site}')}"

    def audit_log(self, actor: str) -> Path:
        return self.dir / "audit" / f"{actor}.jsonl"

    def audit_key(self, actor: str) -> bytes:
        return bytes.fromhex(self.state["secrets"][actor]["audit_key"])

    def _base_env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in _BASE_ENV if k in os.environ}
        env.update(
            {
                "PYTHONUNBUFFERED": "1",
                "TMPDIR": str(self.dir / "tmp"),
                "AWS_DEFAULT_REGION": "us-east-1",
                "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
                "INSITU_CONF": str(self.conf_dir),
                "INSITU_HOME": str(self.dir),
                "DASK_TEMPORARY_DIRECTORY": str(self.dir / "tmp"),
                "DASK_DISTRIBUTED__WORKER__DAEMON": "False",
            }
        )
        return env

    def _prefect_env(self) -> dict[str, str]:
        return {
            "PREFECT_API_URL": self.prefect_api_url,
            "PREFECT_HOME": str(self.dir / "prefect-client"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PREFECT_WORKER_PREFETCH_SECONDS": "5",
            "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "false",
        }

    def _store_env(self, owner: str) -> dict[str, str]:
        ref = self.sites.exchange if owner == "exchange" else self.sites.site(owner)
        sec = self.state["secrets"][owner]
        env: dict[str, str] = {}
        if ref.endpoint_env:
            env[ref.endpoint_env] = self.s3_endpoint(owner)
        if ref.key_env:
            env[ref.key_env] = sec["access_key"]
        if ref.secret_env:
            env[ref.secret_env] = sec["secret_key"]
        return env

    def site_env(self, site: str) -> dict[str, str]:
        """The whole environment of one site's worker: its own store, the exchange, nothing else."""
        s = self.sites.site(site)
        return {
            **self._base_env(),
            **self._prefect_env(),
            **self._store_env(site),
            **self._store_env("exchange"),
            s.dask.scheduler_env: self.dask_address(site),
            "INSITU_SITE": site,
            "INSITU_AUDIT_LOG": str(self.audit_log(site)),
            "INSITU_AUDIT_KEY": self.state["secrets"][site]["audit_key"],
        }

    def dask_env(self, site: str) -> dict[str, str]:
        """A site's Dask workers read that site's store only."""
        # Dask's statistical profiler samples the running thread every 10 ms and takes the GIL to do it:
        # it cost 15-20% of DDP training throughput (bench/ddp_overhead.py).
        return {**self._base_env(), **self._store_env(site), "INSITU_SITE": site,
                "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False"}

    def coordinator_env(self) -> dict[str, str]:
        return {
            **self._base_env(),
            **self._prefect_env(),
            **self._store_env("exchange"),
            "INSITU_ROLE": "coordinator",
            "MLFLOW_TRACKING_URI": self.mlflow_url,
            "INSITU_AUDIT_LOG": str(self.audit_log("coordinator")),
            "INSITU_AUDIT_KEY": self.state["secrets"]["coordinator"]["audit_key"],
        }

    def operator_env(self) -> dict[str, str]:
        """The local operator (CLI, tests): may reach every store, to seed data and to inspect."""
        env = {**self._base_env(), **self._prefect_env(), **self._store_env("exchange")}
        for s in self.sites.names:
            env.update(self._store_env(s))
            env[self.sites.site(s).dask.scheduler_env] = self.dask_address(s)
        env["MLFLOW_TRACKING_URI"] = self.mlflow_url
        return env

    # ------------------------------------------------------------------ components
    def _components(self) -> list[Component]:
        d = self.dir
        base = self._base_env()
        comps = [
            Component(
                "prefect-server",
                [_bin("prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(self.port("prefect")),
                 "--analytics-off"],
                {**base, "PREFECT_HOME": str(d / "prefect-server"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                 "PREFECT_UI_API_URL": self.prefect_api_url, "PREFECT_API_URL": self.prefect_api_url},
                lambda: _http_ok(self.prefect_api_url + "/health"),
                timeout=120,
            ),
            Component(
                "mlflow-server",
                [_bin("mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port("mlflow")),
                 "--workers", "1", "--backend-store-uri", f"sqlite:///{d / 'mlflow' / 'mlflow.db'}",
                 "--artifacts-destination", str(d / "mlflow" / "artifacts")],
                {**base, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
                lambda: _http_ok(self.mlflow_url + "/health"),
                timeout=120,
            ),
        ]
        for owner in ["exchange", *self.sites.names]:
            port = self.port(f"s3-{owner}")
            comps.append(
                Component(f"s3-{owner}", [_bin("moto_server"), "-H", "127.0.0.1", "-p", str(port)], base,
                          lambda p=port: _http_ok(f"http://127.0.0.1:{p}/moto-api/"))
            )
        for s in self.sites.sites:
            port = self.port(f"dask-{s.name}")
            comps.append(
                Component(f"dask-scheduler-{s.name}",
                          [_bin("dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                          self.dask_env(s.name), lambda p=port: _tcp_ok(p))
            )
            comps.append(
                Component(f"dask-workers-{s.name}",
                          [_bin("dask"), "worker", self.dask_address(s.name), "--host", "127.0.0.1",
                           "--nworkers", str(s.dask.local_workers), "--nthreads", "1", "--no-dashboard",
                           "--memory-limit", "2GiB", "--local-directory", str(d / "dask" / s.name),
                           "--name", f"{s.name}-worker"],
                          self.dask_env(s.name),
                          lambda a=self.dask_address(s.name), n=s.dask.local_workers: self._dask_workers_ok(a, n))
            )
        return comps

    def _worker_components(self) -> list[Component]:
        comps = []
        pools = [(self.sites.coordinator.work_pool, self.coordinator_env())]
        pools += [(s.work_pool, self.site_env(s.name)) for s in self.sites.sites]
        for pool, env in pools:
            comps.append(
                Component(
                    f"worker-{pool}",
                    [_bin("prefect"), "worker", "start", "--pool", pool, "--type", "process",
                     "--name", f"{pool}-worker"],
                    env,
                    lambda p=pool: self._worker_online(p),
                    timeout=90,
                )
            )
        return comps

    @staticmethod
    def _dask_workers_ok(address: str, n: int) -> bool:
        from distributed import Client

        try:
            with Client(address, timeout=3) as c:
                return len(c.scheduler_info(n_workers=-1)["workers"]) >= n
        except Exception:
            return False

    def _worker_online(self, pool: str) -> bool:
        import httpx

        try:
            r = httpx.post(f"{self.prefect_api_url}/work_pools/{pool}/workers/filter", json={}, timeout=3)
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
        # A new session per component: signals reach it (and only it), and down() can stop its group.
        proc = subprocess.Popen(comp.command, env=comp.env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=str(REPO), start_new_session=True)
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

    def up(self) -> dict[str, Any]:
        """Start whatever is not running; wait until every component is healthy. Idempotent."""
        t0 = time.monotonic()
        for sub in ("logs", "tmp", "audit", "mlflow/artifacts", "prefect-server", "prefect-client"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        for s in self.sites.sites:
            (self.dir / "dask" / s.name).mkdir(parents=True, exist_ok=True)
        self._save_state()
        started = self._ensure(self._components())
        self._create_buckets()
        self._create_pools()
        started += self._ensure(self._worker_components())
        elapsed = time.monotonic() - t0
        log.info("platform up in %.1fs (started: %s)", elapsed, ", ".join(started) or "nothing, all running")
        return {"seconds": elapsed, "started": started}

    def _create_buckets(self) -> None:
        import s3fs

        for owner in ["exchange", *self.sites.names]:
            ref = self.sites.exchange if owner == "exchange" else self.sites.site(owner)
            if not ref.storage.startswith("s3://"):
                continue
            sec = self.state["secrets"][owner]
            fs = s3fs.S3FileSystem(key=sec["access_key"], secret=sec["secret_key"], skip_instance_cache=True,
                                   client_kwargs={"endpoint_url": self.s3_endpoint(owner)})
            bucket = ref.storage.split("://", 1)[1].split("/", 1)[0]
            if not fs.exists(bucket):
                os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
                fs.mkdir(bucket)

    def _create_pools(self) -> None:
        """Create the missing process work pools with Prefect's own CLI (the core imports no Prefect)."""
        import httpx

        pools = [self.sites.coordinator.work_pool, *[s.work_pool for s in self.sites.sites]]
        env = {**self._base_env(), **self._prefect_env()}
        for pool in pools:
            if httpx.get(f"{self.prefect_api_url}/work_pools/{pool}", timeout=10).status_code == 200:
                continue
            r = subprocess.run([_bin("prefect"), "work-pool", "create", pool, "--type", "process"], env=env,
                               capture_output=True, text=True, timeout=120)
            if r.returncode != 0 and "already exists" not in r.stdout + r.stderr:
                raise PlatformError(f"could not create work pool {pool}: {(r.stdout + r.stderr)[-2000:]}")

    def status(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for c in self._components() + self._worker_components():
            pid = self.state.get("pids", {}).get(c.name)
            alive = self._is_ours(c.name)
            out[c.name] = {"pid": pid, "running": alive, "healthy": alive and c.healthy()}
        return out

    def down(self, timeout: float = 15.0) -> list[str]:
        """Stop every process ``up`` recorded (workers first), and their children. Returns their names."""
        pids: dict[str, int] = self.state.get("pids", {})
        order = sorted(pids, key=lambda n: (not n.startswith("worker-"), not n.startswith("dask-workers"), n))
        stopped = []
        for name in order:
            pid = pids[name]
            if not self._is_ours(name):
                continue
            try:
                procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for p in procs:
                try:
                    p.send_signal(signal.SIGTERM)
                except psutil.NoSuchProcess:
                    pass
            _, alive = psutil.wait_procs(procs, timeout=timeout)
            for p in alive:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(alive, timeout=5)
            if name in self._procs:
                self._procs[name].wait(timeout=5)
            stopped.append(name)
        self.state["pids"] = {}
        self.state["started"] = {}
        self._save_state()
        return stopped

    def apply_env(self, env: dict[str, str] | None = None) -> None:
        """Put the operator's environment into this process (CLI and tests)."""
        os.environ.update(env or self.operator_env())
