"""Principals: people and services that sign what they ask for, with Ed25519 keys (``cryptography``).

A principal is a name, a role and a key pair. The private key stays with its holder (a file only its OS
user can read: ``<name>.key``, PKCS#8 PEM, mode 0600); the public key is 32 bytes, written as hex, and is
what a site admin puts in the site's policy to admit that principal. Nothing here decides who may do what;
it only proves who signed.

Roles (what each may do is enforced where it says):

- ``data-scientist``: signs job requests and standing approvals; each site's policy decides what it admits.
- ``site-admin``: signs its site's policy; a site loads only a policy signed by one of its own admins.
- ``coordinator-operator``: runs the platform and registers models with the coordinator's service
  credentials; the default site policies admit no data action for it.
- ``auditor``: reads and verifies every audit log and exports the timeline.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ROLES = ("data-scientist", "site-admin", "coordinator-operator", "auditor")
PRINCIPAL_NAME = re.compile(r"^[a-z][a-z0-9._-]{0,62}$")
ENV_PRINCIPAL_KEY = "INSITU_PRINCIPAL_KEY"
"""Names the private key file to sign with (the CLI's ``--as`` takes precedence)."""
ENV_PRINCIPALS_DIR = "INSITU_PRINCIPALS_DIR"
"""Where ``--as NAME`` finds ``NAME.key`` (default: ``<state dir>/principals``)."""


class PrincipalError(PermissionError):
    """A key is missing, unreadable by design, malformed, or a signature does not verify."""


def canonical(obj: Any) -> bytes:
    """The bytes a signature covers: JSON with sorted keys, no spaces, no NaN."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")


def check_name(name: str) -> str:
    if not isinstance(name, str) or not PRINCIPAL_NAME.match(name):
        raise PrincipalError(f"principal name {str(name)[:40]!r} must match {PRINCIPAL_NAME.pattern}")
    return name


# --------------------------------------------------------------------------- keys
def new_key_pair(directory: Path, name: str) -> str:
    """Create ``<directory>/<name>.key`` (0600) and ``<name>.pub``; return the public key as hex.

    An existing key is kept (its public key is returned): a principal's identity does not change when the
    platform restarts.
    """
    check_name(name)
    directory.mkdir(parents=True, exist_ok=True)
    key_file = directory / f"{name}.key"
    if key_file.exists():
        return public_key_hex(load_private_key(key_file))
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub = public_key_hex(key)
    (directory / f"{name}.pub").write_text(pub + "\n")
    return pub


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """Read a private key that only its owner can read.

    Raises
    ------
    PrincipalError
        Missing file, a mode that lets others read it, or not an Ed25519 PEM key.
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        raise PrincipalError(f"no private key at {path}") from None
    if st.st_mode & 0o077:
        raise PrincipalError(f"private key {path} has mode {stat.S_IMODE(st.st_mode):04o}; others could read it. "
                             f"Fix: chmod 600 {path}")
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as e:
        raise PrincipalError(f"{path} is not a PEM private key: {e}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise PrincipalError(f"{path} is not an Ed25519 key")
    return key


def public_key_hex(key: Ed25519PrivateKey) -> str:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def key_id(public_hex: str) -> str:
    """A short fingerprint of a public key, for logs and audit entries."""
    return hashlib.sha256(bytes.fromhex(public_hex)).hexdigest()[:16]


def resolve_key_file(as_name: str | None, env: Mapping[str, str] | None = None,
                     default_dir: Path | None = None) -> tuple[str, Path]:
    """Which principal signs and with which key file: ``--as NAME``, else ``INSITU_PRINCIPAL_KEY``.

    Returns
    -------
    (name, path)
        The principal's name (the key file's stem) and its private key file.
    """
    env = os.environ if env is None else env
    if as_name:
        check_name(as_name)
        directory = Path(env.get(ENV_PRINCIPALS_DIR) or default_dir or ".")
        return as_name, directory / f"{as_name}.key"
    named = env.get(ENV_PRINCIPAL_KEY)
    if named:
        path = Path(named)
        return check_name(path.stem), path
    raise PrincipalError(f"no principal to sign as: pass --as NAME (key in ${ENV_PRINCIPALS_DIR} or the platform's "
                         f"principals/ directory) or set {ENV_PRINCIPAL_KEY} to your private key file")


# --------------------------------------------------------------------------- signatures
def sign(key: Ed25519PrivateKey, payload: Any) -> str:
    """Hex Ed25519 signature over the canonical JSON of ``payload``."""
    return key.sign(canonical(payload)).hex()


def verify_signature(public_hex: str, payload: Any, signature_hex: str) -> bool:
    """True when ``signature_hex`` is ``public_hex``'s signature of ``payload``'s canonical JSON."""
    try:
        pub = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_hex))
        pub.verify(bytes.fromhex(signature_hex), canonical(payload))
        return True
    except (InvalidSignature, ValueError, TypeError):
        return False
