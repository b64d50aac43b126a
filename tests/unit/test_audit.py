"""Tamper-evidence of the audit log: every kind of tampering is caught at the right line."""

from __future__ import annotations

import hashlib
import hmac
import json
import multiprocessing
from pathlib import Path

import pytest

from insitu.governance.audit import (
    GENESIS,
    AuditIntegrityError,
    AuditLog,
    new_key,
    read_events,
    verify,
)


def _canonical(obj: dict) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _log(tmp_path: Path, n: int) -> tuple[Path, bytes]:
    path = tmp_path / "audit" / "eu.jsonl"
    key = new_key()
    audit = AuditLog(path, key, actor="eu")
    for i in range(n):
        audit.append("data.read", shard=f"eu/part-{i}", job_id="job-1", flow_run_id=f"run-{i}")
    return path, key


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def _write_lines(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(line + b"\n" for line in lines))


def test_clean_log_verifies_and_chains(tmp_path: Path) -> None:
    path, key = _log(tmp_path, 6)
    res = verify(path, key)
    assert res.ok, res.reason
    assert (res.lines, res.first_bad_line) == (6, None)

    events = read_events(path)
    assert [e["seq"] for e in events] == list(range(6))
    assert events[0]["prev"] == GENESIS
    raw = _lines(path)
    for i in range(1, 6):
        assert events[i]["prev"] == hashlib.sha256(raw[i - 1]).hexdigest()
    assert events[2]["actor"] == "eu" and events[2]["event"] == "data.read"
    assert events[2]["fields"] == {"shard": "eu/part-2", "job_id": "job-1", "flow_run_id": "run-2"}
    assert events[2]["ts"].endswith("+00:00")
    # each line is canonical JSON and carries a valid HMAC over the rest
    for line, ev in zip(raw, events, strict=True):
        assert line == _canonical(ev)
        body = {k: v for k, v in ev.items() if k != "hmac"}
        assert ev["hmac"] == hmac.new(key, _canonical(body), hashlib.sha256).hexdigest()
    head = json.loads((tmp_path / "audit" / "eu.jsonl.head").read_bytes())
    assert head["seq"] == 5 and head["sha256"] == hashlib.sha256(raw[-1]).hexdigest()


def test_append_returns_the_record_written(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "c.jsonl", new_key(), actor="coordinator")
    rec = audit.append("model.registered", name="fraud", version=3)
    assert read_events(tmp_path / "c.jsonl") == [rec]
    assert rec["seq"] == 0 and rec["fields"] == {"name": "fraud", "version": 3}


def test_empty_or_missing_log_is_ok(tmp_path: Path) -> None:
    res = verify(tmp_path / "none.jsonl", new_key())
    assert res.ok and res.lines == 0
    assert read_events(tmp_path / "none.jsonl") == []


def test_edited_field_is_detected_at_its_line(tmp_path: Path) -> None:
    path, key = _log(tmp_path, 6)
    lines = _lines(path)
    rec = json.loads(lines[2])
    rec["fields"]["shard"] = "us/part-2"  # hide a cross-region read
    lines[2] = _canonical(rec)
    _write_lines(path, lines)

    res = verify(path, key)
    assert not res.ok
    assert res.first_bad_line == 3
    assert "line 3" in res.reason and "HMAC" in res.reason


def test_edit_with_recomputed_chain_but_no_key_is_caught_by_hmac(tmp_path: Path) -> None:
    path, key = _log(tmp_path, 6)
    attacker_key = new_key()
    recs = [json.loads(line) for line in _lines(path)]
    recs[2]["fields"]["reason"] = "approved"
    lines: list[bytes] = []
    prev = GENESIS
    for rec in recs:  # the attacker rebuilds the whole chain from line 3 on, signing with a guess
        rec["prev"] = prev
        body = {k: v for k, v in rec.items() if k != "hmac"}
        rec["hmac"] = hmac.new(attacker_key, _canonical(body), hashlib.sha256).hexdigest()
        line = _canonical(rec)
        lines.append(line)
        prev = hashlib.sha256(line).hexdigest()
    _write_lines(path, lines)

    res = verify(path, key)
    assert not res.ok
    assert res.first_bad_line == 1  # every re-signed line fails; the first one is reported
    assert "HMAC" in res.reason

    # re-signing only from the edit on: the untouched prefix passes, the edit is caught
    path2, key2 = _log(tmp_path / "b", 6)
    recs = [json.loads(line) for line in _lines(path2)]
    lines = _lines(path2)[:2]
    prev = hashlib.sha256(lines[-1]).hexdigest()
    recs[2]["fields"]["reason"] = "approved"
    for rec in recs[2:]:
        rec["prev"] = prev
        line = _canonical(rec)  # keeps the old hmac: chain is consistent, signature is not
        lines.append(line)
        prev = hashlib.sha256(line).hexdigest()
    _write_lines(path2, lines)
    res = verify(path2, key2)
    assert (res.ok, res.first_bad_line) == (False, 3)
    assert "HMAC" in res.reason


def test_deleted_middle_line_is_detected(tmp_path: Path) -> None:
    path, key = _log(tmp_path, 6)
    lines = _lines(path)
    del lines[3]
    _write_lines(path, lines)

    res = verify(path, key)
    assert not res.ok
    assert res.first_bad_line == 4
    assert "hash chain broken" in res.reason and "line 3" in res.reason


def test_deleted_first_line_is_detected(tmp_path: Path) -> None:
    path, key = _log(tmp_path, 4)
    _write_lines(path, _lines(path)[1:])
    res = verify(path, key)
    assert (res.ok, res.first_bad_line) == (False, 1)
    assert "hash chain broken" in res.reason


def test_reordered_lines_are_detected(tmp_path: Path) -> None:
    path, key = _log(tmp_path, 6)
    lines = _lines(path)
    lines[2], lines[3] = lines[3], lines[2]
    _write_lines(path, lines)

    res = verify(path, key)
    assert not res.ok
    assert res.first_bad_line == 3


def test_truncated_tail_is_detected_by_head(tmp_path: Path) -> None:
    path, key = _log(tmp_path, 8)
    _write_lines(path, _lines(path)[:6])  # the remaining chain is perfectly valid

    res = verify(path, key)
    assert not res.ok
    assert res.reason == "log truncated: head records seq 7 but the last line is seq 5"


def test_truncated_to_empty_is_detected(tmp_path: Path) -> None:
    path, key = _log(tmp_path, 3)
    path.write_bytes(b"")
    res = verify(path, key)
    assert not res.ok and "truncated" in res.reason


def test_removed_head_file_is_detected(tmp_path: Path) -> None:
    path, key = _log(tmp_path, 4)
    (tmp_path / "audit" / "eu.jsonl.head").unlink()
    res = verify(path, key)
    assert not res.ok
    assert res.reason == "head file missing"


def test_forged_head_is_detected(tmp_path: Path) -> None:
    path, key = _log(tmp_path, 8)
    lines = _lines(path)[:6]
    _write_lines(path, lines)
    head = tmp_path / "audit" / "eu.jsonl.head"
    forged = json.loads(head.read_bytes())
    forged.update(seq=5, sha256=hashlib.sha256(lines[-1]).hexdigest())  # hmac left stale: no key
    head.write_bytes(_canonical(forged))
    res = verify(path, key)
    assert not res.ok and "head file HMAC mismatch" in res.reason


def test_edited_last_line_is_detected(tmp_path: Path) -> None:
    path, key = _log(tmp_path, 3)
    lines = _lines(path)
    lines[-1] = lines[-1].replace(b"{", b"{ ", 1)  # same record, different bytes: only the head sees it
    _write_lines(path, lines)
    res = verify(path, key)
    assert (res.ok, res.first_bad_line) == (False, 3)
    assert "head" in res.reason


def test_garbage_line_is_reported_as_invalid_json(tmp_path: Path) -> None:
    path, key = _log(tmp_path, 5)
    lines = _lines(path)
    lines[3] = b"not json"
    _write_lines(path, lines)
    res = verify(path, key)
    assert (res.ok, res.first_bad_line, res.reason) == (False, 4, "line 4: not valid JSON")


def test_wrong_key_fails_on_first_line(tmp_path: Path) -> None:
    path, _ = _log(tmp_path, 4)
    res = verify(path, new_key())
    assert not res.ok
    assert res.first_bad_line == 1
    assert "HMAC mismatch" in res.reason


def test_append_refuses_to_hide_truncation(tmp_path: Path) -> None:
    path, key = _log(tmp_path, 5)
    _write_lines(path, _lines(path)[:3])
    with pytest.raises(AuditIntegrityError, match="seq 4"):
        AuditLog(path, key, actor="eu").append("data.read", shard="eu/part-9")
    assert "truncated" in verify(path, key).reason  # evidence still there


def test_append_repairs_a_head_left_behind_by_a_crash(tmp_path: Path) -> None:
    path, key = _log(tmp_path, 3)
    head = tmp_path / "audit" / "eu.jsonl.head"
    old_head = head.read_bytes()
    audit = AuditLog(path, key, actor="eu")
    audit.append("data.read", shard="eu/part-3")
    head.write_bytes(old_head)  # as if the process died between the line and the head
    assert not verify(path, key).ok
    audit.append("data.read", shard="eu/part-4")
    res = verify(path, key)
    assert res.ok and res.lines == 5, res.reason


def test_unserialisable_field_writes_nothing(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "c.jsonl", new_key(), actor="coordinator")
    with pytest.raises(TypeError):
        audit.append("data.read", payload=object())
    with pytest.raises(ValueError):
        audit.append("data.read", loss=float("nan"))
    assert read_events(tmp_path / "c.jsonl") == []


def _append_many(path: str, key: bytes, actor: str, n: int) -> None:
    audit = AuditLog(path, key, actor=actor)
    for i in range(n):
        audit.append("data.read", i=i)


def test_concurrent_appends_from_processes_form_one_chain(tmp_path: Path) -> None:
    path = tmp_path / "shared.jsonl"
    key = new_key()
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(str(path), key, f"p{p}", 50)) for p in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
    assert [proc.exitcode for proc in procs] == [0, 0, 0, 0]

    res = verify(path, key)
    assert res.ok, res.reason
    assert res.lines == 200
    events = read_events(path)
    assert [e["seq"] for e in events] == list(range(200))
    for p in range(4):
        assert [e["fields"]["i"] for e in events if e["actor"] == f"p{p}"] == list(range(50))
