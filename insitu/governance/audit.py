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

This module writes; the format is :mod:`insitu.governance.audit_format` and the checks are
:mod:`insitu.governance.audit_verify` (:func:`verify` and :func:`read_events` are importable from here too).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from insitu.governance.audit_format import (
    GENESIS,
    canonical,
    fsync_dir,
    head_path,
    lock_path,
    log_head,
    new_key,
    read_head,
    sha256_hex,
    sign,
    tail_lines,
)
from insitu.governance.audit_verify import VerifyResult, read_events, verify

log = logging.getLogger(__name__)


class AuditIntegrityError(RuntimeError):
    """The log on disk does not match its head file, so appending would hide tampering."""


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
        lock_fd = os.open(lock_path(self.path), os.O_RDWR | os.O_CREAT, 0o640)
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
        canonical(body)  # fail on unserialisable fields before taking the lock
        lock_fd = os.open(lock_path(self.path), os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            seq, prev = self._next_position()
            record = {"seq": seq, "ts": datetime.now(UTC).isoformat(timespec="microseconds"), "prev": prev}
            record.update(body)
            record["hmac"] = sign(self.key, record)
            line = canonical(record)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            try:
                os.write(fd, line + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
            self._write_head(seq, sha256_hex(line))
        finally:
            os.close(lock_fd)  # closing releases the flock
        return json.loads(line)

    def _next_position(self) -> tuple[int, str]:
        """Return ``(seq, prev)`` for the next line, after checking the tail against the head."""
        lines, ends_with_newline = tail_lines(self.path, 2)
        head, why = read_head(self.path, self.key)
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
        last_hash = sha256_hex(lines[-1])
        if head["seq"] == last_seq and head["sha256"] == last_hash:
            return last_seq + 1, last_hash
        # A writer that crashed between the line and the head leaves the head one line behind.
        if len(lines) == 2 and head["seq"] == last_seq - 1 and head["sha256"] == sha256_hex(lines[0]):
            log.warning("%s: head was one line behind (interrupted append); repairing", self.path)
            return last_seq + 1, last_hash
        raise AuditIntegrityError(
            f"{self.path}: head records seq {head['seq']} but the last line is seq {last_seq}"
            " (or its hash differs); run verify before appending"
        )

    def _write_head(self, seq: int, sha256: str) -> None:
        body = {"seq": seq, "sha256": sha256}
        head = head_path(self.path)
        tmp = head.with_name(f"{head.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
        try:
            os.write(fd, canonical({**body, "hmac": sign(self.key, body)}) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, head)
        fsync_dir(head.parent)


__all__ = ["GENESIS", "AuditIntegrityError", "AuditLog", "VerifyResult", "log_head", "new_key", "read_events",
           "verify"]
