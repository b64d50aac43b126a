"""Who the local platform's actors are, their work pools, and the OS users their processes run as."""

from __future__ import annotations

import os

from deployments.platform.users import Account, current_account, ensure_account
from insitu.conf import SitesConfig

COORDINATOR = "coordinator"


class Actors:
    """The coordinator and each site of ``sites``; each its own OS user ``insitu-<actor>`` when isolated."""

    def __init__(self, sites: SitesConfig, isolate: bool) -> None:
        self.sites = sites
        self.isolate = isolate

    @property
    def names(self) -> list[str]:
        return [COORDINATOR, *self.sites.names]

    def work_pool(self, actor: str) -> str:
        return self.sites.coordinator.work_pool if actor == COORDINATOR else self.sites.site(actor).work_pool

    def account(self, actor: str) -> Account:
        """The OS user an actor's processes run as (its own when isolated, else the caller)."""
        return ensure_account(f"insitu-{actor}") if self.isolate else current_account()

    def admin_account(self, actor: str) -> Account:
        """The OS user that owns the actor's root of trust (identity, admin keys, policy, CA key): its admin
        identity, which runs none of the actor's processes (the caller when not isolated)."""
        return ensure_account(f"insitu-{actor}-admin") if self.isolate else current_account()

    def store_account(self, server: str) -> Account:
        """The OS user a local S3 endpoint (a site's store, the exchange) runs as and keeps its data as: no actor
        reads another's objects from the disk, and none bypasses the endpoint's IAM policies."""
        return ensure_account(f"insitu-{server}-store") if self.isolate else current_account()

    def audit_account(self) -> Account:
        """The OS user the audit services run as: no actor's processes can read the keys or touch the logs."""
        return ensure_account("insitu-audit") if self.isolate else current_account()

    def database_account(self) -> Account:
        """The OS user the control plane's PostgreSQL runs as and keeps its files as: never root (PostgreSQL refuses
        it), never an actor (no site reads Prefect's or MLflow's tables from the disk)."""
        return ensure_account("insitu-postgres") if os.geteuid() == 0 else current_account()
