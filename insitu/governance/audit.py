"""Tamper-evident, append-only audit log: JSON lines chained by SHA-256 and signed with HMAC.

Every data access, policy decision, registration and alias change on a site (or on the
coordinator) is appended here. Each line is the canonical JSON of one record::

    {"actor":"eu","event":"data.read","fields":{...},"hmac":"...","prev":"...","seq":3,"ts":"..."}

``prev`` is the SHA-256 of the previous line's exact bytes (64 zeros for ``seq`` 0), so an
edited, deleted or reordered line breaks the chain; ``hmac`` is HMAC-SHA256 with the log's key
over the canonical JSON of the record without ``hmac``, so an attacker who rewrites a line and
recomputes the chain is still caught unless they hold the key. Beside ``X.jsonl`` a head file
``X.jsonl.head`` records the last ``seq`` and the hash of the last line (signed too), so cutting
lines off the end is detected. This is the CloudTrail digest idea, kept local: it cannot catch
an attacker who holds the key, or one who rolls back both the log and an old copy of its head.

Appends from several processes are serialised by an exclusive ``fcntl.flock`` on ``X.jsonl.lock``.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import logging
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

GENESIS = "0" * 64
"""The ``prev`` value of the first line (``seq`` 0)."""


_RECORD_KEYS = frozenset({"seq", "ts", "actor", "event", "fields", "prev", "hmac"})
_TAIL_BLOCK = 8192


class AuditIntegrityError(RuntimeError):
    """The log on disk does not match its head file, so appending would hide tampering."""


# --------------------------------------------------------------------------- helpers
def new_key() -> bytes:
    """Return a fresh random 32-byte HMAC key.

    Returns
    -------
    bytes
        32 bytes from :func:`os.urandom`; an actor's identity file holds them hex-encoded.
    """
    return os.urandom(32)


def _canonical(obj: Any) -> bytes:
    """Serialise ``obj`` as canonical JSON (sorted keys, no spaces, no NaN)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("ascii")


def _sign(key: bytes, obj: dict[str, Any]) -> str:
    """Return the hex HMAC-SHA256 of the canonical JSON of ``obj``."""
    return hmac.new(key, _canonical(obj), hashlib.sha256).hexdigest()


def _sha256(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


def _head_path(path: Path) -> Path:
    return path.with_name(path.name + ".head")


def _lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _tail_lines(path: Path, n: int) -> tuple[list[bytes], bool]:
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
            step = min(_TAIL_BLOCK, pos)
            pos -= step
            f.seek(pos)
            buf = f.read(step) + buf
    ends_with_newline = buf.endswith(b"\n")
    body = buf[:-1] if ends_with_newline else buf
    lines = body.split(b"\n")
    if pos > 0:  # the first piece may be a partial line
        lines = lines[1:]
    return lines[-n:], ends_with_newline


def _read_head(path: Path, key: bytes) -> tuple[dict[str, Any] | None, str]:
    """Load and check the head file.

    Returns ``(head, "")`` if valid, ``(None, reason)`` if bad, ``(None, "")`` if missing.
    """
    try:
        raw = _head_path(path).read_bytes()
    except FileNotFoundError:
        return None, ""
    try:
        head = json.loads(raw)
    except ValueError:
        return None, "head file is not valid JSON"
    if not isinstance(head, dict) or set(head) != {"seq", "sha256", "hmac"}:
        return None, "head file is malformed (expected keys seq, sha256, hmac)"
    body = {"seq": head["seq"], "sha256": head["sha256"]}
    if not isinstance(head["hmac"], str) or not hmac.compare_digest(head["hmac"], _sign(key, body)):
        return None, "head file HMAC mismatch (head edited or wrong key)"
    return head, ""


def log_head(path: str | Path) -> tuple[int, str] | None:
    """``(seq, sha256)`` of a log's last line, read from the log itself (None for an empty or missing log)."""
    lines, _ = _tail_lines(Path(path), 1)
    if not lines or not lines[-1]:
        return None
    return int(json.loads(lines[-1])["seq"]), _sha256(lines[-1])


# --------------------------------------------------------------------------- writer
class AuditLog:
    """An append-only, hash-chained, HMAC-signed JSON-lines audit log.

    Parameters
    ----------
    path : str or Path
        The log file, conventionally ``<something>.jsonl``; parent directories are created.
    key : bytes
        The HMAC key (keep it off the machine that could tamper with the log where possible).
    actor : str
        Who writes the records, e.g. a site name such as ``"eu"`` or ``"coordinator"``.

    Examples
    --------
    >>> audit = AuditLog(tmp / "eu.jsonl", new_key(), actor="eu")  # doctest: +SKIP
    >>> audit.append("data.read", shard="eu/part-0", flow_run_id="...")  # doctest: +SKIP
    """

    def __init__(self, path: str | Path, key: bytes, actor: str) -> None:
        if not key:
            raise ValueError("audit key must not be empty")
        if not actor:
            raise ValueError("audit actor must not be empty")
        self.path = Path(path)
        self.key = bytes(key)
        self.actor = actor
        self.defaults: dict[str, Any] = {}
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def with_fields(self, **defaults: Any) -> AuditLog:
        """The same log, with ``defaults`` added to every record appended through the returned object
        (e.g. the verified principal of the request a site flow runs for)."""
        bound = AuditLog(self.path, self.key, self.actor)
        bound.defaults = {**self.defaults, **defaults}
        return bound

    def head(self) -> tuple[int, str] | None:
        """``(seq, sha256)`` of the last line (what an anchor records), read under the append lock."""
        lock_fd = os.open(_lock_path(self.path), os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_SH)
            return log_head(self.path)
        finally:
            os.close(lock_fd)

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one signed record and update the head file, under an exclusive lock.

        Parameters
        ----------
        event : str
            What happened, e.g. ``"data.read"``, ``"residency.refused"``, ``"model.registered"``.
        **fields
            JSON-serialisable details (shard, job_id, flow_run_id, reason, ...).

        Returns
        -------
        dict
            The record as written, including ``seq``, ``prev`` and ``hmac``.

        Raises
        ------
        TypeError, ValueError
            If ``fields`` is not JSON-serialisable (NaN and infinity are refused).
        AuditIntegrityError
            If the tail of the log does not match its head file (truncated, edited, head
            deleted): appending would rewrite the head and hide the tampering.
        """
        body: dict[str, Any] = {"actor": self.actor, "event": event, "fields": {**self.defaults, **fields}}
        _canonical(body)  # fail on unserialisable fields before taking the lock
        lock_fd = os.open(_lock_path(self.path), os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            seq, prev = self._next_position()
            record = {"seq": seq, "ts": datetime.now(UTC).isoformat(timespec="microseconds"), "prev": prev}
            record.update(body)
            record["hmac"] = _sign(self.key, record)
            line = _canonical(record)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            try:
                os.write(fd, line + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
            self._write_head(seq, _sha256(line))
        finally:
            os.close(lock_fd)  # closing releases the flock
        return json.loads(line)

    def _next_position(self) -> tuple[int, str]:
        """Return ``(seq, prev)`` for the next line, after checking the tail against the head."""
        lines, ends_with_newline = _tail_lines(self.path, 2)
        head, why = _read_head(self.path, self.key)
        if why:
            raise AuditIntegrityError(f"{self.path}: {why}; run verify before appending")
        if not lines:
            if head is not None:
                raise AuditIntegrityError(
                    f"{self.path}: log truncated: head records seq {head['seq']} but the log is empty"
                )
            return 0, GENESIS
        if not ends_with_newline:
            raise AuditIntegrityError(f"{self.path}: last line is incomplete (no trailing newline)")
        if head is None:
            raise AuditIntegrityError(f"{self.path}: head file missing for a non-empty log")
        try:
            last = json.loads(lines[-1])
            last_seq = last["seq"]
        except (ValueError, TypeError, KeyError):
            raise AuditIntegrityError(f"{self.path}: last line is not a valid record") from None
        last_hash = _sha256(lines[-1])
        if head["seq"] == last_seq and head["sha256"] == last_hash:
            return last_seq + 1, last_hash
        # A writer that crashed between the line and the head leaves the head one line behind.
        if len(lines) == 2 and head["seq"] == last_seq - 1 and head["sha256"] == _sha256(lines[0]):
            log.warning("%s: head was one line behind (interrupted append); repairing", self.path)
            return last_seq + 1, last_hash
        raise AuditIntegrityError(
            f"{self.path}: head records seq {head['seq']} but the last line is seq {last_seq}"
            " (or its hash differs); run verify before appending"
        )

    def _write_head(self, seq: int, sha256: str) -> None:
        body = {"seq": seq, "sha256": sha256}
        head = _head_path(self.path)
        tmp = head.with_name(f"{head.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
        try:
            os.write(fd, _canonical({**body, "hmac": _sign(self.key, body)}) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, head)
        _fsync_dir(head.parent)


# --------------------------------------------------------------------------- readers
@dataclass
class VerifyResult:
    """Outcome of :func:`verify`.

    Attributes
    ----------
    ok : bool
        True if every line and the head file check out.
    lines : int
        Lines examined (the whole log when ``ok``; up to and including the bad line otherwise).
    first_bad_line : int or None
        1-based number of the first bad line, or None (clean, or a head-file problem).
    reason : str
        A sentence saying what is wrong, or what was checked when ``ok``.
    """

    ok: bool
    lines: int
    first_bad_line: int | None
    reason: str


def _check_line(n: int, line: bytes, prev_line: bytes | None, key: bytes) -> str:
    """Return why line ``n`` (1-based) is bad, or ``""`` if it is good."""
    try:
        rec = json.loads(line)
    except ValueError:
        return f"line {n}: not valid JSON"
    if not isinstance(rec, dict) or set(rec) != _RECORD_KEYS:
        return f"line {n}: not an audit record (expected keys {', '.join(sorted(_RECORD_KEYS))})"
    body = {k: v for k, v in rec.items() if k != "hmac"}
    try:
        expected_mac = _sign(key, body)
    except ValueError:
        return f"line {n}: not canonical JSON"
    if not isinstance(rec["hmac"], str) or not hmac.compare_digest(rec["hmac"], expected_mac):
        return f"line {n}: HMAC mismatch (line edited or wrong key)"
    if prev_line is None:
        if rec["prev"] != GENESIS:
            return f"line {n}: hash chain broken: first line's prev is not 64 zeros (start deleted)"
    elif rec["prev"] != _sha256(prev_line):
        return f"line {n}: hash chain broken: prev does not match line {n - 1} (edited, deleted or reordered)"
    seq = rec["seq"]
    if not isinstance(seq, int) or isinstance(seq, bool) or seq != n - 1:
        return f"line {n}: seq {seq} out of order, expected {n - 1}"
    return ""


def verify(path: str | Path, key: bytes, required: bool = False) -> VerifyResult:
    """Check the hash chain, every HMAC, the sequence numbers and the head file of a log.

    Parameters
    ----------
    path : str or Path
        The ``.jsonl`` log; its head file is ``<path>.head``.
    key : bytes
        The HMAC key the log was written with.
    required : bool
        The log must exist (a deployed actor's log): a missing log and head are a failure, not an empty log.

    Returns
    -------
    VerifyResult
        ``ok`` is False on the first problem found, with the line and a reason.
    """
    path = Path(path)
    if required and not path.exists():
        why = "log missing (and its head file too)" if not _head_path(path).exists() else "log missing"
        return VerifyResult(False, 0, None, f"{why}: this actor is deployed, so its log must exist")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = b""
    head, head_why = _read_head(path, key)
    head_exists = _head_path(path).exists()

    if not data:
        if not head_exists:
            return VerifyResult(True, 0, None, "empty log, no head file")
        if head is None:
            return VerifyResult(False, 0, None, head_why)
        why = f"log truncated: head records seq {head['seq']} but the log is empty"
        return VerifyResult(False, 0, None, why)

    complete = data.endswith(b"\n")
    lines = (data[:-1] if complete else data).split(b"\n")
    prev_line: bytes | None = None
    for i, line in enumerate(lines, start=1):
        why = _check_line(i, line, prev_line, key)
        if why:
            return VerifyResult(False, i, i, why)
        prev_line = line
    n = len(lines)
    if not complete:
        return VerifyResult(False, n, n, f"line {n}: incomplete (no trailing newline)")

    if not head_exists:
        return VerifyResult(False, n, None, "head file missing")
    if head is None:
        return VerifyResult(False, n, None, head_why)
    last_seq = n - 1
    if head["seq"] != last_seq:
        if isinstance(head["seq"], int) and head["seq"] > last_seq:
            why = f"log truncated: head records seq {head['seq']} but the last line is seq {last_seq}"
        else:
            why = (
                f"head records seq {head['seq']} but the last line is seq {last_seq}"
                " (head rolled back, or an append was interrupted)"
            )
        return VerifyResult(False, n, None, why)
    if head["sha256"] != _sha256(lines[-1]):
        return VerifyResult(False, n, n, f"line {n}: last line does not match the hash in the head file")
    return VerifyResult(True, n, None, f"{n} lines verified: hash chain, HMACs, sequence and head all intact")


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """Return every record of a log as dicts, oldest first, without verifying anything.

    Parameters
    ----------
    path : str or Path
        The ``.jsonl`` log; a missing file reads as no events.

    Returns
    -------
    list of dict
        One dict per line. Use :func:`verify` first if the log may have been tampered with.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


__all__ = ["AuditIntegrityError", "AuditLog", "VerifyResult", "new_key", "read_events", "verify"]
