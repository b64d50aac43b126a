"""The audit service (a real process on a real Unix socket): appends as its own actor, serves its head."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from insitu.governance.audit import new_key, read_events, verify
from insitu.governance.audit_service import AuditClient, AuditServiceError


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[AuditClient, bytes, Path]]:
    key = new_key()
    cfg = tmp_path / "service.json"
    log = tmp_path / "eu.jsonl"
    sock = tmp_path / "eu.sock"
    cfg.write_text(json.dumps({"actor": "eu", "log": str(log), "key": key.hex(), "socket": str(sock),
                               "allowed_uids": [os.getuid()]}))
    proc = subprocess.Popen([sys.executable, "-m", "insitu.governance.audit_service", "--config", str(cfg)],
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert time.monotonic() < deadline and proc.poll() is None, "audit service did not start"
            time.sleep(0.05)
        yield AuditClient(sock, "eu", log), key, log
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_service_signs_what_its_actor_appends(service: tuple[AuditClient, bytes, Path]) -> None:
    client, key, log = service
    assert client.head() is not None  # the log exists from the start: "audit.started"
    rec = client.with_fields(principal="alice").append("data.read", shard="eu-000")
    assert rec["actor"] == "eu" and rec["fields"] == {"principal": "alice", "shard": "eu-000"}
    assert client.head()[0] == rec["seq"]  # type: ignore[index]
    assert [e["event"] for e in read_events(log)] == ["audit.started", "data.read"]
    assert verify(log, key, required=True).ok


def test_a_bad_request_is_answered_with_an_error_not_recorded(service: tuple[AuditClient, bytes, Path]) -> None:
    client, key, log = service
    with pytest.raises(AuditServiceError, match="expected"):
        client._call({"op": "rewrite", "seq": 0})
    with pytest.raises(AuditServiceError, match="expected"):
        client._call({"op": "append", "event": "x", "fields": "not a dict"})
    assert [e["event"] for e in read_events(log)] == ["audit.started"]


def test_an_unreachable_service_is_an_error_not_a_silent_skip(tmp_path: Path) -> None:
    with pytest.raises(AuditServiceError, match="unreachable"):
        AuditClient(tmp_path / "none.sock", "eu", tmp_path / "eu.jsonl").append("data.read")
