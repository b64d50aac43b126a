"""Who this process is: an actor's identity, read only from the file the actor's own platform gave it.

A site (or the coordinator) is started by its operator with ``INSITU_IDENTITY`` naming its identity
file: the actor's name, role, work pool, audit log and audit service (or key). Nothing a run's caller can set
decides any of these: the site worker refuses runs that carry job variables or environment overrides
(``deployments/worker.py``), and this module refuses a file that another OS user could have written or
can read, and a process whose environment carries Prefect runtime overrides (``PREFECT__RUNTIME__*``,
which would let a caller forge what ``prefect.runtime`` reports).

The file is JSON. On the local platform an actor has no ``audit_key`` but an ``audit_socket``: its audit
service holds the key (``insitu.governance.audit_service``), and ``audit_service_key`` pins that service's
Ed25519 public key, so the actor's audit client talks only to its real service (``audit_proof``)::

    {"actor": "eu", "role": "site", "work_pool": "insitu-eu", "admin": "insitu-eu-admin",
     "audit_log": "/…/audit/eu/eu.jsonl", "audit_socket": "/…/audit/eu.sock",
     "audit_service_key": "<Ed25519 public key, hex>",
     "policy": "/…/admin/eu/policy.json", "admins": {"eu-admin": "<Ed25519 public key, hex>"}}

``admins`` is the site's root of trust for its policy: only a policy signed by one of these keys is loaded
(``insitu.governance.policy``). The coordinator's file has no policy and no admins.

Who owns the file decides who controls the actor's root of trust. With ``admin`` (an OS user, the site's
admin identity) the file must be owned by that user, and neither it nor its directory writable by this
process's user (the runtime, which runs flows, Dask and user code, may read it, never change it or swap
it). Without ``admin`` (a developer's machine, not root: one user runs everything) the file must be this
user's and owner-only, as before; the separation of admin and runtime needs root.
"""

from __future__ import annotations

import json
import os
import pwd
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from insitu.governance.audit import AuditLog
from insitu.governance.audit_service import AuditClient

ENV_IDENTITY = "INSITU_IDENTITY"
RUNTIME_OVERRIDE_PREFIX = "PREFECT__RUNTIME__"
RULE_RUNTIME_OVERRIDE = "identity.no-runtime-overrides"
RULE_POOL = "residency.site-pool"
RULE_ADMIN_OWNED = "identity.admin-owned"

Role = Literal["site", "coordinator"]


class IdentityError(PermissionError):
    """This process has no trustworthy identity, or its environment tries to override one."""


@dataclass(frozen=True)
class Identity:
    """An actor's identity, as its own platform configured it."""

    actor: str
    role: Role
    work_pool: str
    audit_log: Path
    audit_key: bytes | None
    path: Path
    policy: Path | None = None
    admins: dict[str, str] = field(default_factory=dict)
    audit_socket: Path | None = None
    audit_service_key: str | None = None
    """The audit service's Ed25519 public key (hex): every answer of the service must be signed by it."""
    admin: str | None = None
    """The OS user that owns this identity (the site's admin identity); None when the runtime's user does."""

    def audit(self) -> AuditLog | AuditClient:
        """The actor's own audit log (where and how from this identity, never from a request): through its
        audit service when it has one (the actor then never holds the key), else written directly."""
        if self.audit_socket is not None:
            if not self.audit_service_key:  # fail closed: an unpinned service could be anyone's
                raise IdentityError(f"identity file {self.path} names an audit service but pins no "
                                    "audit_service_key: the service cannot be verified")
            return AuditClient(self.audit_socket, self.actor, self.audit_log, self.audit_service_key)
        if not self.audit_key:
            raise IdentityError(f"identity file {self.path} names neither an audit service nor an audit key")
        return AuditLog(self.audit_log, self.audit_key, self.actor)

    @classmethod
    def from_json(cls, text: str, path: Path) -> Identity:
        """Parse an identity file's text (``path`` is where it lives).

        Raises
        ------
        IdentityError
            When a key is missing, the role unknown or the audit key not non-empty hex.
        """
        try:
            raw = json.loads(text)
            role = raw["role"]
            if role not in ("site", "coordinator"):
                raise ValueError(f"role {role!r} is neither 'site' nor 'coordinator'")
            sock = raw.get("audit_socket")
            key = bytes.fromhex(raw["audit_key"]) if "audit_key" in raw or not sock else None
            if key is not None and not key:
                raise ValueError("audit_key is empty")
            admins = raw.get("admins") or {}
            if not isinstance(admins, dict) or not all(isinstance(v, str) for v in admins.values()):
                raise ValueError("admins must map admin names to hex public keys")
            policy = raw.get("policy")
            service_key = raw.get("audit_service_key")
            if sock and not (isinstance(service_key, str) and len(bytes.fromhex(service_key)) == 32):
                raise ValueError("audit_socket needs audit_service_key, the service's Ed25519 public key (64 hex)")
            admin = raw.get("admin")
            if admin is not None and not isinstance(admin, str):
                raise ValueError("admin must be an OS user name")
            return cls(actor=str(raw["actor"]), role=role, work_pool=str(raw["work_pool"]),
                       audit_log=Path(raw["audit_log"]), audit_key=key, path=path,
                       policy=Path(policy) if policy else None, admins=dict(admins),
                       audit_socket=Path(sock) if sock else None, audit_service_key=service_key, admin=admin)
        except (ValueError, KeyError, TypeError) as e:
            raise IdentityError(f"identity file {path} is malformed: {e!r}; expected keys actor, role, work_pool, "
                                "audit_log, audit_key (hex)") from None

    def to_json(self) -> str:
        out: dict[str, Any] = {"actor": self.actor, "role": self.role, "work_pool": self.work_pool,
                               "audit_log": str(self.audit_log)}
        if self.admin is not None:
            out["admin"] = self.admin
        if self.audit_socket is not None:
            out["audit_socket"] = str(self.audit_socket)
            out["audit_service_key"] = self.audit_service_key
        if self.audit_key:
            out["audit_key"] = self.audit_key.hex()
        if self.policy is not None:
            out.update(policy=str(self.policy), admins=self.admins)
        return json.dumps(out, indent=2)


def write_private(path: Path, text: str, uid: int | None = None, gid: int | None = None, mode: int = 0o600) -> None:
    """Replace ``path`` with ``text``, owner-only (0600, or ``mode``), owned by ``uid``/``gid`` when given.

    Written to a fresh file, never one that is already there, then renamed over ``path``: a symbolic link
    planted at either name is replaced, not followed.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), mode)
        if uid is not None:
            os.fchown(f.fileno(), uid, gid if gid is not None else -1)
        f.write(text)
    os.replace(tmp, path)


def write_identity(path: Path, identity: Identity, uid: int | None = None, gid: int | None = None,
                   mode: int = 0o600) -> None:
    """Write ``identity`` to ``path`` (see :func:`write_private`)."""
    write_private(path, identity.to_json(), uid, gid, mode)


def load_identity(env: Mapping[str, str] | None = None) -> Identity:
    """Read this process's identity from the file ``INSITU_IDENTITY`` names.

    Raises
    ------
    IdentityError
        When the variable is unset, the file is missing or malformed, is not owned by this process's
        user, or can be read or written by anyone else.
    """
    env = os.environ if env is None else env
    name = env.get(ENV_IDENTITY)
    if not name:
        raise IdentityError(f"{ENV_IDENTITY} is not set: this process was not started by a site or coordinator "
                            "platform, so it has no identity and may not touch site data")
    path = Path(name)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise IdentityError(f"{ENV_IDENTITY}={path}: no such file") from None
    if not stat.S_ISREG(st.st_mode):
        raise IdentityError(f"{ENV_IDENTITY}={path}: not a regular file")
    ident = Identity.from_json(path.read_text(), path)
    why = ownership_refusal(path, st, ident.admin, os.geteuid())
    if why:
        raise IdentityError(why)
    return ident


def ownership_refusal(path: Path, st: os.stat_result, admin: str | None, me: int) -> str:
    """Why the identity file ``path`` (stat ``st``) cannot be trusted by the process of user ``me``; "" if it can.

    With an ``admin``, the file must be that OS user's, not writable by group or others, and its directory not
    writable by ``me`` (else the runtime could rename it away and put its own in place). Without one, the file
    must be ``me``'s and owner-only (a developer's machine: one user runs everything).
    """
    mode = stat.S_IMODE(st.st_mode)
    admin_uid = _uid_of(admin) if admin else None
    if admin is None or admin_uid == me:
        if st.st_uid != me:
            return (f"identity file {path} is owned by uid {st.st_uid}, not by this process's user (uid {me}): "
                    "it was not written for this actor")
        if mode & 0o077:
            return f"identity file {path} has mode {mode:04o}: others could read or change it. Fix: chmod 600 {path}"
        return ""
    if admin_uid is None or st.st_uid != admin_uid:
        return (f"identity file {path} is owned by uid {st.st_uid}, not by its admin {admin!r}: it was not written "
                f"by the site's admin identity; rule {RULE_ADMIN_OWNED}")
    if mode & 0o027:
        return (f"identity file {path} has mode {mode:04o}: only its admin may write it and only the runtime's "
                f"group read it. Fix: chmod 640 {path}; rule {RULE_ADMIN_OWNED}")
    parent = path.parent.stat()
    if parent.st_uid == me or stat.S_IMODE(parent.st_mode) & 0o022:
        return (f"the directory of identity file {path} is writable by this process's user or by others: the "
                f"runtime could replace the file. Fix: give {path.parent} to {admin!r}, mode 0750; "
                f"rule {RULE_ADMIN_OWNED}")
    return ""


def _uid_of(user: str) -> int | None:
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def runtime_overrides(env: Mapping[str, str] | None = None) -> list[str]:
    """Names of ``PREFECT__RUNTIME__*`` variables in ``env`` (each would forge a ``prefect.runtime`` value)."""
    env = os.environ if env is None else env
    return sorted(k for k in env if k.upper().startswith(RUNTIME_OVERRIDE_PREFIX))


def refuse_runtime_overrides(identity: Identity, flow_run_id: str | None,
                             env: Mapping[str, str] | None = None) -> None:
    """Refuse (and audit) a process whose environment overrides Prefect's runtime values.

    Raises
    ------
    IdentityError
        Naming the variables found.
    """
    found = runtime_overrides(env)
    if not found:
        return
    msg = (f"{identity.role} {identity.actor!r} refuses to run: its environment carries Prefect runtime overrides "
           f"{found}, which a caller could use to forge this run's identity; rule {RULE_RUNTIME_OVERRIDE}")
    identity.audit().append("run.refused", flow_run_id=flow_run_id, rule=RULE_RUNTIME_OVERRIDE, variables=found,
                            reason=msg)
    raise IdentityError(msg)


def check_pool(identity: Identity, run_pool: str | None, flow_run_id: str | None, job_id: str | None) -> None:
    """Refuse (and audit) a flow run whose work pool, as the Prefect API reports it, is not this actor's.

    Raises
    ------
    IdentityError
        When ``run_pool`` differs from the identity's pool (``None`` counts as different).
    """
    if run_pool == identity.work_pool:
        return
    msg = (f"{identity.role} {identity.actor!r} refuses flow run {flow_run_id}: the API says it belongs to work pool "
           f"{run_pool!r}, this worker serves {identity.work_pool!r}; rule {RULE_POOL}")
    identity.audit().append("residency.refused", job_id=job_id, flow_run_id=flow_run_id, rule=RULE_POOL,
                            run_pool=run_pool, reason=msg)
    raise IdentityError(msg)
