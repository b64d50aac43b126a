"""Provisioning the servers once they run: S3 buckets and IAM users, MLflow's users, the locked work pools."""

from __future__ import annotations

from typing import Any

from deployments.platform.actors import COORDINATOR, Actors
from deployments.platform.endpoints import Endpoints
from deployments.platform.errors import PlatformError
from deployments.platform.health import prefect_headers
from deployments.platform.paths import PlatformPaths
from deployments.platform.state import PlatformState
from insitu.conf import SitesConfig


def bucket(storage: str) -> str:
    return storage.split("://", 1)[1].split("/", 1)[0]


def s3_policies(sites: SitesConfig, server: str) -> dict[str, dict[str, Any]]:
    """IAM user → inline policy on ``server``'s endpoint (the same documents ``docs/iam/`` ships for AWS)."""
    from insitu.governance.iam import exchange_coordinator_policy, exchange_site_policy, site_store_policy

    if server == "exchange":
        b = bucket(sites.exchange.storage)
        return {COORDINATOR: exchange_coordinator_policy(b), **{s: exchange_site_policy(b, s) for s in sites.names}}
    return {server: site_store_policy(bucket(sites.site(server).storage))}


class Provisioning:
    """What the platform sets up on its own servers: keys and users go to the state file, never to a site."""

    def __init__(self, paths: PlatformPaths, sites: SitesConfig, actors: Actors, state: PlatformState,
                 endpoints: Endpoints) -> None:
        self._paths = paths
        self._sites = sites
        self._actors = actors
        self._state = state
        self._urls = endpoints

    def s3_restored(self, server: str) -> bool:
        """Whether ``server`` came back with the set-up it was provisioned with (``platform.s3_disk``): its users
        and the keys this state file holds. A store that kept a set-up the state file does not match (the state
        file replaced, the store's directory copied from elsewhere) is refused: its objects would be out of reach."""
        import json

        setup_file = self._paths.store_dir(server) / "setup.json"
        if not setup_file.is_file():
            return False
        setup = json.loads(setup_file.read_text())
        held = self._state.data["secrets"]["s3"].get(server, {})
        kept = {u: rec["keys"][-1] for u, rec in setup.get("users", {}).items() if rec.get("keys")}
        wanted = set(s3_policies(self._sites, server))
        if set(kept) == wanted and all([held.get(u, {}).get("access_key"), held.get(u, {}).get("secret_key")] == k
                                       for u, k in kept.items()):
            return True
        raise PlatformError(
            f"{setup_file.parent}: the store {server!r} kept a set-up for users {sorted(kept)} whose keys this "
            f"platform's state file does not hold (users {sorted(wanted)} expected). Fix: start it from the state "
            "directory it belongs to, or wipe the platform's data (`insitu down --wipe`)")

    def s3(self, server: str) -> None:
        """On a just-started endpoint, in its unauthenticated setup window: the bucket, its IAM users and keys."""
        from insitu.governance.iam import provision

        ref = self._sites.exchange if server == "exchange" else self._sites.site(server)
        keys = provision(self._urls.s3_endpoint(server), bucket(ref.storage), s3_policies(self._sites, server))
        self._state.record_s3_keys(server, keys)

    def mlflow_auth_config(self, database_uri: str) -> None:
        """MLflow's basic-auth configuration (it holds the admin password the server starts with)."""
        from deployments.platform.mlflow_server import write_auth_config

        write_auth_config(self._paths.mlflow_auth_ini, database_uri, self._state.mlflow_password("admin"))

    def databases(self) -> None:
        """The control plane's roles and databases on its PostgreSQL (their passwords from the state file)."""
        from deployments.platform import postgres

        if self._state.database == "postgres":
            postgres.provision(self._urls.port("postgres"), self._state.database_password("superuser"),
                               {r: self._state.database_password(r) for r in postgres.DATABASES})

    def mlflow_users(self) -> None:
        """The coordinator (the registry's one writer) and the operator (a reader) on a just-started server."""
        from deployments.platform.mlflow_server import provision_users

        provision_users(self._urls.mlflow_url, self._state.mlflow_password("admin"),
                        {u: self._state.mlflow_password(u) for u in (COORDINATOR, "operator")}, writer=COORDINATOR)

    def pools(self) -> None:
        """Create or re-lock the work pools: a fixed job template that no run can vary (no variables)."""
        from deployments.platform.pools import ensure_locked_pool

        headers = prefect_headers(self._state.prefect_auth)
        for actor in self._actors.names:
            ensure_locked_pool(self._urls.prefect_api_url, headers, self._actors.work_pool(actor))
