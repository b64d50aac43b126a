"""The exact environment each process of the platform starts with: an actor gets its own secrets, nothing else.

A site's worker holds its own store's keys and its own IAM user's keys to the exchange; the coordinator's
holds the exchange's and MLflow's writer password; no site process gets another site's variables, the
audit keys (they are in the owner-only identity file and the audit service), or MLflow's credentials.
The security tests (tests/unit/test_platform_env.py, tests/security/) check exactly these sets.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from deployments.platform.actors import COORDINATOR
from deployments.platform.endpoints import Endpoints
from deployments.platform.paths import PlatformPaths
from deployments.platform.state import PlatformState
from deployments.platform.users import Account, current_account
from deployments.unresponsive import HEARTBEAT_S
from insitu.conf import SitesConfig
from insitu.governance.anchor_signing import ENV_AUDIT_SERVICE_KEYS
from insitu.governance.approvals import ENV_APPROVALS
from insitu.governance.identity import ENV_IDENTITY

# The only variables of the caller's own environment any process inherits.
BASE_ENV = ("PATH", "LANG", "LC_ALL", "SHELL")
# An idle site's Dask processes wake 50 times a second for the event-loop health tick and twice a second for the
# system monitor: about 2% of a core each, a fifth of a core for the local platform's schedulers and workers
# (measured: 1.7-1.9% per idle process by default, 0.3-0.5% with these). Neither feeds anything insitu uses.
# Each nanny also reads its worker's memory ten times a second: once a second keeps the 2 GiB limit enforced and
# cut a site's idle workers from 2.6% to 0.9% of a core (bench/pipeline_overhead.py measures the platform's).
IDLE_DASK = {"DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "1s", "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL": "5s",
             "DASK_DISTRIBUTED__WORKER__MEMORY__MONITOR_INTERVAL": "1s"}


class Environments:
    """Builds each actor's (and the operator's, and the servers') environment from the state and the layout."""

    def __init__(self, paths: PlatformPaths, sites: SitesConfig, conf_dir: Path, state: PlatformState,
                 endpoints: Endpoints, account: Callable[[str], Account]) -> None:
        self._paths = paths
        self._sites = sites
        self._conf_dir = conf_dir
        self._state = state
        self._urls = endpoints
        self._account = account

    def base(self, actor: str | None = None) -> dict[str, str]:
        """What every process gets; an actor's own home, user and temporary directory when ``actor`` is set."""
        env = {k: os.environ[k] for k in BASE_ENV if k in os.environ}
        home = self._paths.home_or_root(actor)
        tmp = home / "tmp"
        env.update(
            {
                "HOME": str(home),
                "USER": self._account(actor).name if actor else current_account().name,
                "PYTHONUNBUFFERED": "1",
                "TMPDIR": str(tmp),
                "AWS_DEFAULT_REGION": "us-east-1",
                "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
                # Offline, MLflow's telemetry client fails to start and unsets its session variable from a thread
                # while another thread copies os.environ: a job died of KeyError '_MLFLOW_TELEMETRY_SESSION_ID'.
                "MLFLOW_DISABLE_TELEMETRY": "true",
                "INSITU_CONF": str(self._conf_dir),
                "DASK_TEMPORARY_DIRECTORY": str(tmp),
                "DASK_DISTRIBUTED__WORKER__DAEMON": "False",
                "MPLCONFIGDIR": str(tmp / "matplotlib"),
            }
        )
        return env

    def prefect(self, actor: str | None = None) -> dict[str, str]:
        """A Prefect client's settings: the API, its credential, and the actor's own Prefect home."""
        return {
            "PREFECT_API_URL": self._urls.prefect_api_url_for(actor),
            "PREFECT_API_AUTH_STRING": self._state.prefect_auth,
            "PREFECT_HOME": str(self._paths.prefect_home(actor)),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PREFECT_WORKER_PREFETCH_SECONDS": "5",
            "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "false",
            # every flow run's heartbeat: a run whose process is gone is marked Crashed (deployments/unresponsive.py)
            "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S),
        }

    def store(self, server: str, user: str) -> dict[str, str]:
        """The variables ``sites.yaml`` names for ``server``'s store, holding ``user``'s own IAM keys."""
        ref = self._sites.exchange if server == "exchange" else self._sites.site(server)
        env: dict[str, str] = {}
        if ref.endpoint_env:
            env[ref.endpoint_env] = self._urls.s3_endpoint_for(user, server)
        if not self._state.s3_provisioned(server):
            return env  # not provisioned yet (before up): the endpoint alone
        key, secret = self._state.s3_credentials(server, user)
        if ref.key_env:
            env[ref.key_env] = key
        if ref.secret_env:
            env[ref.secret_env] = secret
        return env

    def dask_tls(self, site: str) -> dict[str, str]:
        """Dask's own configuration, as variables: every connection of this site's processes is mutual TLS."""
        from insitu.governance.pki import CA_CERT, LEAF_CERT, LEAF_KEY

        d = self._paths.tls_dir(site)
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

    def site(self, site: str) -> dict[str, str]:
        """The whole environment of one site's worker: its own store, its own keys to the exchange, nothing else."""
        s = self._sites.site(site)
        return {
            **self.base(site),
            **self.prefect(site),
            **self.store(site, site),
            **self.store("exchange", site),
            **self.dask_tls(site),
            s.dask.scheduler_env: self._urls.dask_address(site),
            ENV_IDENTITY: str(self._paths.identity_file(site)),
        }

    def dask(self, site: str) -> dict[str, str]:
        """A site's Dask scheduler and workers read that site's store only."""
        # Dask's statistical profiler samples the running thread every 10 ms and takes the GIL to do it:
        # it cost 15-20% of DDP training throughput (bench/ddp_overhead.py).
        # On an isolated platform a site's namespace has its loopback and its border: gloo's peers meet on the first.
        gloo = {"GLOO_SOCKET_IFNAME": "lo"} if self._urls.net is not None else {}
        return {**self.base(site), **self.store(site, site), **self.dask_tls(site),
                "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False", **IDLE_DASK, **gloo}

    def coordinator(self) -> dict[str, str]:
        return {
            **self.base(COORDINATOR),
            **self.prefect(COORDINATOR),
            **self.store("exchange", COORDINATOR),
            "MLFLOW_TRACKING_URI": self._urls.mlflow_url_for(COORDINATOR),
            "MLFLOW_TRACKING_USERNAME": COORDINATOR,
            "MLFLOW_TRACKING_PASSWORD": self._state.mlflow_password(COORDINATOR),
            ENV_IDENTITY: str(self._paths.identity_file(COORDINATOR)),
            ENV_APPROVALS: str(self._paths.approvals_dir),
            ENV_AUDIT_SERVICE_KEYS: str(self._paths.audit_service_keys),  # it countersigns signed anchors only
        }

    def operator(self) -> dict[str, str]:
        """The local operator (CLI, tests): seeds each site's store with that site's keys, reads the
        exchange with the coordinator's, reads MLflow (never writes it), and reaches the Prefect API."""
        env = {**self.base(), **self.prefect(), **self.store("exchange", COORDINATOR)}
        if self._sites.exchange.endpoint_env:  # the coordinator's keys, from where the operator is (the host)
            env[self._sites.exchange.endpoint_env] = self._urls.s3_endpoint("exchange")
        for s in self._sites.names:
            env.update(self.store(s, s))
            env[self._sites.site(s).dask.scheduler_env] = self._urls.dask_address(s)
        env.update({"MLFLOW_TRACKING_URI": self._urls.mlflow_url, "MLFLOW_TRACKING_USERNAME": "operator",
                    "MLFLOW_TRACKING_PASSWORD": self._state.mlflow_password("operator")})
        return env
