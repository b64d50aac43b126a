"""Where everything of the local platform lives on disk, per actor: homes, identities, policies, keys, logs.

The state directory (``.insitu`` by default) is the operator's (root's when isolated): its ``state.json``,
``logs/`` and the servers' data are never handed to a site. Each actor has a home ``actors/<actor>/``
(TLS leaf key, Prefect and Dask files, temporary files), the runtime's; its root of trust lives apart in
``admin/<actor>/``, owned by the actor's admin identity (``insitu-<actor>-admin`` when root): the identity file,
the signed policy and the record of its accepted version (the runtime's group may read them), and the site's CA
(``ca/``, the admin's only). The audit services keep each actor's log and key in ``audit/<actor>/``, out of
every actor's reach.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# deployments/platform/paths.py → the checkout: conf/, and the working directory of every component.
REPO = Path(__file__).resolve().parents[2]

# The operator's own private directories in the state directory (servers' data and the operator's Prefect).
OPERATOR_DIRS = ("logs", "tmp", "mlflow", "mlflow/artifacts", "prefect-server", "prefect-client")


@dataclass(frozen=True)
class PlatformPaths:
    """The layout of one platform's state directory ``root``."""

    root: Path
    # On an isolated platform each audit service listens on an abstract socket named with this tag, in its actor's
    # network namespace (``platform.netns``); else on a file in the audit directory.
    abstract_audit: str | None = None

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def log_file(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    @property
    def stores_dir(self) -> Path:
        return self.root / "stores"

    def store_dir(self, server: str) -> Path:
        """An S3 endpoint's objects and IAM set-up, kept across restarts (``platform.s3_disk``): the store's own."""
        return self.stores_dir / server

    # ------------------------------------------------------------------ actors' homes
    @property
    def actors_dir(self) -> Path:
        return self.root / "actors"

    def actor_home(self, actor: str) -> Path:
        return self.actors_dir / actor

    # ------------------------------------------------------------------ actors' roots of trust (their admins')
    @property
    def admin_root(self) -> Path:
        return self.root / "admin"

    def admin_dir(self, actor: str) -> Path:
        """The actor's root of trust: its admin's, readable (not writable) by the actor's runtime group."""
        return self.admin_root / actor

    def identity_file(self, actor: str) -> Path:
        return self.admin_dir(actor) / "identity.json"

    def policy_file(self, site: str) -> Path:
        return self.admin_dir(site) / "policy.json"

    def policy_record(self, site: str) -> Path:
        """The newest policy version the site accepted (``insitu.governance.policy_version``)."""
        return self.admin_dir(site) / "accepted.json"

    def ca_dir(self, site: str) -> Path:
        """The site's CA (its private key): the admin's only, never the runtime's."""
        return self.admin_dir(site) / "ca"

    def tls_dir(self, site: str) -> Path:
        return self.actor_home(site) / "tls"

    def home_or_root(self, actor: str | None) -> Path:
        """An actor's home, or the state directory for the operator and the servers (``actor`` None)."""
        return self.actor_home(actor) if actor else self.root

    def prefect_home(self, actor: str | None) -> Path:
        """Prefect's client home: the actor's own, or the operator's ``prefect-client``."""
        return self.actor_home(actor) / "prefect" if actor else self.root / "prefect-client"

    # ------------------------------------------------------------------ audit services
    @property
    def audit_dir(self) -> Path:
        """The audit services' own directory: each actor's log and key, readable only by ``insitu-audit``."""
        return self.root / "audit"

    def audit_log(self, actor: str) -> Path:
        return self.audit_dir / actor / f"{actor}.jsonl"

    def audit_socket(self, actor: str) -> Path:
        if self.abstract_audit:
            return Path(f"@insitu-{self.abstract_audit}-audit-{actor}")
        return self.audit_dir / f"{actor}.sock"

    @property
    def audit_service_keys(self) -> Path:
        """The audit services' public keys (root's, readable by all): what anchors are checked against."""
        return self.root / "audit-service-keys.json"

    def audit_service_file(self, actor: str) -> Path:
        return self.audit_dir / actor / "service.json"

    # ------------------------------------------------------------------ principals and approvals
    @property
    def principals_dir(self) -> Path:
        """The demo principals' key pairs: the caller's, never an actor's (a site cannot sign as a person)."""
        return self.root / "principals"

    def principal_key_file(self, name: str) -> Path:
        return self.principals_dir / f"{name}.key"

    @property
    def approvals_dir(self) -> Path:
        """Standing approvals the coordinator may use for UI and scheduled runs (signed, not secret)."""
        return self.root / "approvals"

    # ------------------------------------------------------------------ servers' data
    @property
    def mlflow_dir(self) -> Path:
        return self.root / "mlflow"

    @property
    def mlflow_auth_ini(self) -> Path:
        return self.mlflow_dir / "basic_auth.ini"

    @property
    def prefect_server_home(self) -> Path:
        return self.root / "prefect-server"

    @property
    def postgres_dir(self) -> Path:
        """The control plane's PostgreSQL: its cluster in ``data/``, the database account's only (0700)."""
        return self.root / "postgres"
