"""The state file: what the platform chooses once (ports, secrets), what it records (PIDs), read back on every call.

``state.json`` is the operator's copy of every credential: root's, 0600, in a directory never handed to a site.
The platform generates the audit keys, the Prefect API credential and the MLflow passwords itself; the S3
keys are issued by each endpoint's IAM when it first starts and recorded here.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from pathlib import Path
from typing import Any

from deployments.platform.actors import COORDINATOR
from deployments.platform.errors import PlatformError
from deployments.platform.processes import alive
from insitu.conf import SitesConfig
from insitu.governance.audit_proof import new_service_key

STATE_FORMAT = 2
DEFAULT_PORTS = {"prefect": 4200, "mlflow": 5055, "s3-exchange": 9100, "postgres": 5433}
DATABASES = ("postgres", "sqlite")  # where the control plane (Prefect, MLflow) keeps its state


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def choose_ports(sites: SitesConfig, given: dict[str, int], free: bool) -> dict[str, int]:
    """Each server's port: the one given, else a free one (``free``), else its default."""
    names = ["prefect", "mlflow", "s3-exchange", "postgres"]
    names += [f"s3-{s.name}" for s in sites.sites] + [f"dask-{s.name}" for s in sites.sites]
    defaults = dict(DEFAULT_PORTS)
    for i, s in enumerate(sites.sites):
        defaults[f"s3-{s.name}"] = 9101 + i
        defaults[f"dask-{s.name}"] = 8701 + i
    return {n: given.get(n) or (free_port() if free else defaults[n]) for n in names}


def new_secrets(actors: list[str]) -> dict[str, Any]:
    """Secrets the platform chooses itself; S3 keys are issued by each endpoint's IAM when it starts."""
    return {
        "audit": {a: secrets.token_hex(32) for a in actors},
        # each audit service's Ed25519 key: it signs its answers (and anchors); its public key is pinned
        "audit_signing": {a: new_service_key() for a in actors},
        "prefect_auth": f"insitu:{secrets.token_urlsafe(24)}",
        "mlflow": {u: secrets.token_urlsafe(18) for u in ("admin", COORDINATOR, "operator", "flask-secret")},
        "s3": {},
        "postgres": new_database_passwords(),
    }


def new_database_passwords() -> dict[str, str]:
    """The control plane database's superuser and one role per server (``platform.postgres``)."""
    return {role: secrets.token_urlsafe(24) for role in ("superuser", "prefect", "mlflow")}


def choose_database(recorded: str | None, asked: str | None, fresh: bool, path: Path) -> str:
    """The control plane's database: chosen when the platform is new and kept for its life (the other holds none
    of its runs). A platform from before the choice existed keeps SQLite, with its data."""
    if asked is not None and asked not in DATABASES:
        raise PlatformError(f"--database {asked!r}: choose one of {', '.join(DATABASES)}")
    if fresh:
        if asked is not None:
            return asked
        from deployments.platform.postgres import available

        return "postgres" if available() else "sqlite"
    kept = recorded or "sqlite"
    if asked is not None and asked != kept:
        raise PlatformError(f"{path}: this platform keeps its runs and models in {kept}, not {asked}. Fix: start it "
                            f"with `--database {kept}` (or without --database), or wipe its data first "
                            f"(`insitu down --wipe`) to start afresh on {asked}")
    return kept


class PlatformState:
    """The state file's content (``data``, saved with :meth:`save`) and the secrets read from it."""

    def __init__(self, path: Path, data: dict[str, Any], older_running: bool = False) -> None:
        self.path = path
        self.data = data
        self.older_running = older_running  # processes of an older insitu's platform are still running

    @classmethod
    def open(cls, path: Path, sites: SitesConfig, actors: list[str], ports: dict[str, int] | None,
             free_ports: bool, database: str | None = None) -> PlatformState:
        """Read the state file, or start one: ports chosen (``ports`` win), secrets generated once, the control
        plane's database chosen once (``database``, else PostgreSQL where its server is installed)."""
        data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        older_running = False
        if data.get("format") != STATE_FORMAT:
            # A platform from an older insitu: keep what `down` needs to stop it, start afresh otherwise.
            older_running = any(alive(pid) for pid in data.get("pids", {}).values())
            data = {k: data[k] for k in ("pids", "started", "ports") if k in data} if older_running else {}
        data["format"] = STATE_FORMAT
        fresh = not data.get("secrets")
        if not data.get("ports"):
            data["ports"] = choose_ports(sites, ports or {}, free_ports)
        else:  # a state file from before a server was added gets that server's port
            data["ports"].update(ports or {})
            for name, port in choose_ports(sites, ports or {}, free_ports).items():
                data["ports"].setdefault(name, port)
        if fresh:
            data["secrets"] = new_secrets(actors)
        data["secrets"].setdefault("postgres", new_database_passwords())
        data["database"] = choose_database(data.get("database"), database, fresh, path)
        signing = data["secrets"].setdefault("audit_signing", {})  # state files from before the services signed
        for a in actors:
            signing.setdefault(a, new_service_key())
        return cls(path, data, older_running)

    @property
    def database(self) -> str:
        """Where the control plane keeps its state: ``postgres`` or ``sqlite``."""
        return str(self.data["database"])

    def database_password(self, role: str) -> str:
        """The password of ``role`` (``superuser``, ``prefect``, ``mlflow``) on the control plane's PostgreSQL."""
        return str(self.data["secrets"]["postgres"][role])

    def save(self) -> None:
        """Write the state file atomically, owner-only (0600) from its first byte."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(self.data, indent=2))
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)

    def port(self, name: str) -> int:
        return int(self.data["ports"][name])

    # ------------------------------------------------------------------ secrets
    @property
    def prefect_auth(self) -> str:
        return str(self.data["secrets"]["prefect_auth"])

    def mlflow_password(self, user: str) -> str:
        return str(self.data["secrets"]["mlflow"][user])

    def audit_key(self, actor: str) -> bytes:
        return bytes.fromhex(self.data["secrets"]["audit"][actor])

    def audit_signing_key(self, actor: str) -> str:
        """The actor's audit service's Ed25519 private key (hex; see ``insitu.governance.audit_proof``)."""
        return str(self.data["secrets"]["audit_signing"][actor])

    def s3_provisioned(self, server: str) -> bool:
        """Has ``server``'s endpoint issued its IAM keys yet (it does on its first start)?"""
        return server in self.data["secrets"]["s3"]

    def s3_credentials(self, server: str, user: str) -> tuple[str, str]:
        """The (access key, secret) IAM issued to ``user`` on ``server``'s endpoint (a site or 'exchange')."""
        try:
            c = self.data["secrets"]["s3"][server][user]
        except KeyError:
            raise PlatformError(f"no S3 credentials for {user} on {server}'s endpoint: is the platform up?") from None
        return c["access_key"], c["secret_key"]

    def record_s3_keys(self, server: str, keys: dict[str, tuple[str, str]]) -> None:
        """Keep the keys ``server``'s IAM just issued (user → (access key, secret)), and save."""
        self.data["secrets"]["s3"][server] = {u: {"access_key": k, "secret_key": s} for u, (k, s) in keys.items()}
        self.save()
