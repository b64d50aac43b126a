"""An audit service proves who it is: a signed answer to a fresh challenge, checked with the pinned key.

The pure checks, then a real service on a real socket: a client facing a service with another key (one the
runtime started itself) fails closed, and so does one facing a service that does not sign.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from insitu.governance.audit import new_key, read_events
from insitu.governance.audit_proof import (
    RULE_AUDIT_SERVICE,
    new_challenge,
    new_service_key,
    proof_refusal,
    prove,
    service_key,
    service_public_hex,
)
from insitu.governance.audit_service import AuditClient, AuditServiceError


def test_a_signed_answer_to_this_challenge_verifies() -> None:
    k = new_service_key()
    c = new_challenge()
    answer = {"record": {"seq": 3, "event": "data.read"}}
    signed = {**answer, "proof": prove(service_key(k), "eu", c, answer)}
    assert proof_refusal(service_public_hex(k), "eu", c, signed) == ""


def test_another_key_challenge_actor_or_answer_is_refused() -> None:
    k, other = new_service_key(), new_service_key()
    c = new_challenge()
    answer = {"record": {"seq": 3}}
    signed = {**answer, "proof": prove(service_key(k), "eu", c, answer)}
    pinned = service_public_hex(k)
    assert "does not verify" in proof_refusal(service_public_hex(other), "eu", c, signed)
    assert "does not verify" in proof_refusal(pinned, "eu", new_challenge(), signed)  # a replayed answer
    assert "does not verify" in proof_refusal(pinned, "us", c, signed)
    assert "does not verify" in proof_refusal(pinned, "eu", c, {**signed, "record": {"seq": 4}})
    assert "not signed" in proof_refusal(pinned, "eu", c, answer)
    assert new_challenge() != new_challenge() and len(new_challenge()) == 64


def _start(tmp_path: Path, name: str, signing_key: str | None) -> tuple[subprocess.Popen[bytes], Path, Path]:
    cfg, log, sock = tmp_path / f"{name}.json", tmp_path / f"{name}.jsonl", tmp_path / f"{name}.sock"
    spec = {"actor": "eu", "log": str(log), "key": new_key().hex(), "socket": str(sock),
            "allowed_uids": [os.getuid()], **({"signing_key": signing_key} if signing_key else {})}
    cfg.write_text(json.dumps(spec))
    proc = subprocess.Popen([sys.executable, "-m", "insitu.governance.audit_service", "--config", str(cfg)],
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not (sock.exists() and log.exists() and read_events(log)):  # up once it logged "audit.started"
        assert time.monotonic() < deadline and proc.poll() is None, "audit service did not start"
        time.sleep(0.05)
    return proc, sock, log


@pytest.fixture
def services(tmp_path: Path) -> Iterator[dict[str, tuple[Path, Path]]]:
    real_key = new_service_key()
    procs = {}
    try:
        procs["real"] = _start(tmp_path, "real", real_key)
        procs["fake"] = _start(tmp_path, "fake", new_service_key())  # the runtime's own service, its own key
        procs["unsigned"] = _start(tmp_path, "unsigned", None)
        yield {"pinned": service_public_hex(real_key), **{n: (p[1], p[2]) for n, p in procs.items()}}  # type: ignore[dict-item]
    finally:
        for proc, _, _ in procs.values():
            proc.terminate()
            proc.wait(10)


def test_the_real_service_is_verified_at_every_request(services: dict) -> None:
    sock, log = services["real"]
    client = AuditClient(sock, "eu", log, services["pinned"])
    rec = client.append("data.read", shard="eu-000")
    assert rec["fields"] == {"shard": "eu-000"} and "challenge" not in rec["fields"]
    assert client.head()[0] == rec["seq"]  # type: ignore[index]


@pytest.mark.parametrize("which", ["fake", "unsigned"])
def test_a_client_facing_another_service_fails_closed(services: dict, which: str) -> None:
    sock, log = services[which]
    client = AuditClient(sock, "eu", log, services["pinned"])
    with pytest.raises(AuditServiceError, match=f"not the one its identity pins.*{RULE_AUDIT_SERVICE}"):
        client.append("data.read", shard="eu-000")
    with pytest.raises(AuditServiceError, match=RULE_AUDIT_SERVICE):
        client.head()
    # The service may have written the line, but the caller was told it is unaudited: it goes no further.
    assert [e["event"] for e in read_events(log)][:1] == ["audit.started"]
