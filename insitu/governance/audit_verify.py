"""Reading an audit log back: :func:`verify` checks the hash chain, every HMAC, the sequence numbers and the
head file; :func:`read_events` returns the records without checking anything."""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from insitu.governance.audit_format import GENESIS, RECORD_KEYS, head_path, read_head, sha256_hex, sign


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
    if not isinstance(rec, dict) or set(rec) != RECORD_KEYS:
        return f"line {n}: not an audit record (expected keys {', '.join(sorted(RECORD_KEYS))})"
    body = {k: v for k, v in rec.items() if k != "hmac"}
    try:
        expected_mac = sign(key, body)
    except ValueError:
        return f"line {n}: not canonical JSON"
    if not isinstance(rec["hmac"], str) or not hmac.compare_digest(rec["hmac"], expected_mac):
        return f"line {n}: HMAC mismatch (line edited or wrong key)"
    if prev_line is None:
        if rec["prev"] != GENESIS:
            return f"line {n}: hash chain broken: first line's prev is not 64 zeros (start deleted)"
    elif rec["prev"] != sha256_hex(prev_line):
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
        why = "log missing (and its head file too)" if not head_path(path).exists() else "log missing"
        return VerifyResult(False, 0, None, f"{why}: this actor is deployed, so its log must exist")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = b""
    head, head_why = read_head(path, key)
    head_exists = head_path(path).exists()

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
    if head["sha256"] != sha256_hex(lines[-1]):
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
