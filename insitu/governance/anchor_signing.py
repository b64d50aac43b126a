"""Signed anchors: only an actor's audit service can vouch for its log's head.

A site's runtime holds its own exchange credentials, so it can write anything under ``anchors/<site>/``.
An anchor therefore counts only when it carries the Ed25519 signature of the actor's *audit service* (the
process that holds the audit key and runs as its own OS user, not the site's runtime) over the statement
``{purpose, actor, seq, sha256, prev}``; ``prev`` is the id (SHA-256 of the canonical statement) of the
anchor the service signed before, or 64 zeros, so a service's anchors form one chain in the order it signed
them. Anything else found under ``anchors/`` is noise: reported by name and why, never taken as evidence.

The service keeps the last anchor it signed beside its log; asked again while the head has not moved, it
answers with the same anchor (nothing new to vouch for). The verifier knows each service's public key
from the platform (the identity's pinned ``audit_service_key``, or the public file the coordinator reads).

Pure functions; the audit service calls :func:`next_anchor`, ``insitu.governance.anchors`` checks objects.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

# The audit service has one Ed25519 key: it signs its answers (audit_proof) and its anchors.
from insitu.governance.audit_proof import new_service_key  # noqa: F401 (re-exported)
from insitu.governance.audit_proof import service_key as private_key  # noqa: F401
from insitu.governance.audit_proof import service_public_hex as public_hex  # noqa: F401
from insitu.governance.principals import canonical, sign, verify_signature

PURPOSE = "insitu-audit-anchor"
GENESIS = "0" * 64
SIGNED_KEYS = frozenset({"purpose", "actor", "seq", "sha256", "prev", "signature"})
ENV_AUDIT_SERVICE_KEYS = "INSITU_AUDIT_SERVICE_KEYS"
"""Path of a JSON file ``{actor: Ed25519 public key hex}``: the audit services whose anchors a reader trusts."""
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def statement(actor: str, seq: int, sha256: str, prev: str) -> dict[str, Any]:
    """What the service signs: this actor's line ``seq`` hashes to ``sha256``, after anchor ``prev``."""
    return {"purpose": PURPOSE, "actor": actor, "seq": seq, "sha256": sha256, "prev": prev}


def anchor_id(signed: Mapping[str, Any]) -> str:
    """The id of a signed anchor (what the next anchor's ``prev`` names): SHA-256 of its statement."""
    return hashlib.sha256(canonical({k: signed[k] for k in SIGNED_KEYS - {"signature"}})).hexdigest()


def sign_anchor(key: Ed25519PrivateKey, actor: str, seq: int, sha256: str, prev: str = GENESIS) -> dict[str, Any]:
    """The statement with the service's signature (hex) added."""
    body = statement(actor, seq, sha256, prev)
    return {**body, "signature": sign(key, body)}


def next_anchor(key: Ed25519PrivateKey, actor: str, head: tuple[int, str], last: Mapping[str, Any] | None
                ) -> dict[str, Any]:
    """The anchor for ``head``: the ``last`` one again when the head has not moved, else a new one after it."""
    if last is not None and (last["seq"], last["sha256"]) == head:
        return dict(last)
    return sign_anchor(key, actor, head[0], head[1], anchor_id(last) if last is not None else GENESIS)


def refusal(body: Any, actor: str, seq: int, sha256: str, public: str | None) -> str:
    """Why ``body`` (an object found at the key of ``actor``'s anchor ``seq``/``sha256``) is no valid anchor;
    ``""`` when it is one, signed by ``actor``'s audit service (public key ``public``)."""
    if public is None:
        return f"no audit service key is known for {actor!r}, so nothing can vouch for this anchor"
    if not isinstance(body, dict) or not SIGNED_KEYS <= set(body):
        return "unsigned: not a signed anchor (expected " + ", ".join(sorted(SIGNED_KEYS)) + ")"
    if body["purpose"] != PURPOSE or not isinstance(body["prev"], str) or not _HEX64.match(body["prev"]):
        return "not an anchor statement (purpose or prev malformed)"
    if (body["actor"], body["seq"], body["sha256"]) != (actor, seq, sha256):
        return (f"its body says {body['actor']!r} seq {body['seq']!r}, which is not what its key says "
                f"({actor!r} seq {seq})")
    if not isinstance(body["signature"], str) or \
            not verify_signature(public, statement(actor, seq, sha256, body["prev"]), body["signature"]):
        return f"bad signature: not signed by {actor}'s audit service"
    return ""


# --------------------------------------------------------------------------- the service's own record
def read_last(path: Path) -> dict[str, Any] | None:
    """The last anchor a service signed (kept in its own directory), or None."""
    try:
        return dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return None


def write_last(path: Path, signed: Mapping[str, Any]) -> None:
    """Keep the anchor just signed (atomically: a crash leaves the old one or the new one)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(dict(signed), sort_keys=True))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# --------------------------------------------------------------------------- who the verifier trusts
def write_service_keys(path: Path, keys: Mapping[str, str]) -> None:
    """Publish the audit services' public keys (``actor → hex``), readable by all (they are no secret)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o644)
        f.write(json.dumps(dict(keys), indent=2, sort_keys=True))
    os.replace(tmp, path)


def load_service_keys(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The audit services' public keys this process was given (``$INSITU_AUDIT_SERVICE_KEYS``); {} if none."""
    where = (os.environ if env is None else env).get(ENV_AUDIT_SERVICE_KEYS)
    if not where:
        return {}
    raw = json.loads(Path(where).read_text())
    if not isinstance(raw, dict) or not all(isinstance(v, str) and _HEX64.match(v) for v in raw.values()):
        raise ValueError(f"{where}: expected {{actor: Ed25519 public key (64 hex)}}")
    return {str(k): v for k, v in raw.items()}
