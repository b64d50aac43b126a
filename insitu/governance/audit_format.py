"""The audit log's format on disk: canonical signed records, the hash chain's start, the signed head file,
and reading a log's last lines without reading the whole log.

The writer (:class:`insitu.governance.audit.AuditLog`) and the verifier (:mod:`insitu.governance.audit_verify`)
both build on these, so that what one writes is exactly what the other checks.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any

GENESIS = "0" * 64
"""The ``prev`` value of the first line (``seq`` 0)."""


RECORD_KEYS = frozenset({"seq", "ts", "actor", "event", "fields", "prev", "hmac"})
TAIL_BLOCK = 8192


def new_key() -> bytes:
    """Return a fresh random 32-byte HMAC key.

    Returns
    -------
    bytes
        32 bytes from :func:`os.urandom`; an actor's identity file holds them hex-encoded.
    """
    return os.urandom(32)


def canonical(obj: Any) -> bytes:
    """Serialise ``obj`` as canonical JSON (sorted keys, no spaces, no NaN)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("ascii")


def sign(key: bytes, obj: dict[str, Any]) -> str:
    """Return the hex HMAC-SHA256 of the canonical JSON of ``obj``."""
    return hmac.new(key, canonical(obj), hashlib.sha256).hexdigest()


def sha256_hex(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


def head_path(path: Path) -> Path:
    return path.with_name(path.name + ".head")


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tail_lines(path: Path, n: int) -> tuple[list[bytes], bool]:
    """Return up to the last ``n`` lines of ``path`` (without newlines) and whether it ends in one.

    Reads backwards in blocks, so the cost does not grow with the size of the log.
    """
    if not path.exists():
        return [], True
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        if end == 0:
            return [], True
        buf = b""
        pos = end
        while pos > 0 and buf.count(b"\n") <= n:
            step = min(TAIL_BLOCK, pos)
            pos -= step
            f.seek(pos)
            buf = f.read(step) + buf
    ends_with_newline = buf.endswith(b"\n")
    body = buf[:-1] if ends_with_newline else buf
    lines = body.split(b"\n")
    if pos > 0:  # the first piece may be a partial line
        lines = lines[1:]
    return lines[-n:], ends_with_newline


def read_head(path: Path, key: bytes) -> tuple[dict[str, Any] | None, str]:
    """Load and check the head file.

    Returns ``(head, "")`` if valid, ``(None, reason)`` if bad, ``(None, "")`` if missing.
    """
    try:
        raw = head_path(path).read_bytes()
    except FileNotFoundError:
        return None, ""
    try:
        head = json.loads(raw)
    except ValueError:
        return None, "head file is not valid JSON"
    if not isinstance(head, dict) or set(head) != {"seq", "sha256", "hmac"}:
        return None, "head file is malformed (expected keys seq, sha256, hmac)"
    body = {"seq": head["seq"], "sha256": head["sha256"]}
    if not isinstance(head["hmac"], str) or not hmac.compare_digest(head["hmac"], sign(key, body)):
        return None, "head file HMAC mismatch (head edited or wrong key)"
    return head, ""


def log_head(path: str | Path) -> tuple[int, str] | None:
    """``(seq, sha256)`` of a log's last line, read from the log itself (None for an empty or missing log)."""
    lines, _ = tail_lines(Path(path), 1)
    if not lines or not lines[-1]:
        return None
    return int(json.loads(lines[-1])["seq"]), sha256_hex(lines[-1])
