"""Signed anchors: only the actor's audit service vouches for a head; anything else under anchors/ is noise.

Pure logic on a file:// exchange, plus the real audit service process signing anchors over its socket.
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

from insitu.governance import anchor_signing as sig
from insitu.governance import anchors
from insitu.governance.audit import AuditLog, new_key
from insitu.governance.audit_service import AuditClient
from insitu.governance.trail import verify_trail
from insitu.storage import Store

SERVICE = sig.new_service_key()
KEYS = {"eu": sig.public_hex(SERVICE)}


def _log(d: Path, n: int) -> AuditLog:
    log = AuditLog(d / "eu.jsonl", new_key(), "eu")
    for i in range(n):
        log.append("data.read", i=i)
    return log


def _store(tmp_path: Path) -> Store:
    (tmp_path / "exchange").mkdir(exist_ok=True)
    return Store(f"file://{tmp_path / 'exchange'}/")


def _anchor(log: AuditLog, last: dict | None = None, key: str = SERVICE) -> dict:
    h = log.head()
    assert h is not None
    return sig.next_anchor(sig.private_key(key), "eu", h, last)


def _put(ex: Store, key: str, body: object) -> None:
    ex.write_bytes(key, json.dumps(body).encode())


def test_a_signed_anchor_counts_and_is_checked(tmp_path: Path) -> None:
    ex, log = _store(tmp_path), _log(tmp_path, 3)
    a = anchors.publish_head(ex, _anchor(log), job_id="j1")
    found = anchors.list_anchors(ex, KEYS)
    assert found.anchors == [a] and found.noise == []
    (r,) = verify_trail({"eu": (log.path, log.key)}, found)
    assert r.ok and r.anchors == 1 and not r.noise


def test_an_unsigned_anchor_with_a_huge_seq_is_noise_not_a_rollback(tmp_path: Path) -> None:
    ex, log = _store(tmp_path), _log(tmp_path, 3)
    anchors.publish_head(ex, _anchor(log))
    bogus = anchors.anchor_key("eu", 999_999_999_999, "f" * 64)
    _put(ex, bogus, {"actor": "eu", "seq": 999_999_999_999, "sha256": "f" * 64})
    found = anchors.list_anchors(ex, KEYS)
    assert [n.key for n in found.noise] == [bogus] and "unsigned" in found.noise[0].why
    (r,) = verify_trail({"eu": (log.path, log.key)}, found)
    assert r.ok and "rolled back" not in r.reason and "noise" in r.reason, r.reason
    assert [n.key for n in r.noise] == [bogus]


def test_a_badly_signed_or_moved_anchor_is_noise(tmp_path: Path) -> None:
    ex, log = _store(tmp_path), _log(tmp_path, 3)
    other = sig.new_service_key()  # e.g. a key the site's runtime made itself
    forged = sig.sign_anchor(sig.private_key(other), "eu", 10**9, "a" * 64)
    _put(ex, anchors.anchor_key("eu", 10**9, "a" * 64), forged)
    real = _anchor(log)
    _put(ex, anchors.anchor_key("eu", 10**9, real["sha256"]), real)  # a real anchor copied under a bigger seq
    tampered = {**real, "prev": "1" * 64}  # the chain link changed: the signature no longer covers it
    _put(ex, anchors.anchor_key("eu", real["seq"], real["sha256"]), tampered)
    why = {n.key: n.why for n in anchors.list_anchors(ex, KEYS).noise}
    assert "bad signature" in why[anchors.anchor_key("eu", 10**9, "a" * 64)]
    assert "not what its key says" in why[anchors.anchor_key("eu", 10**9, real["sha256"])]
    assert "bad signature" in why[anchors.anchor_key("eu", real["seq"], real["sha256"])]
    (r,) = verify_trail({"eu": (log.path, log.key)}, anchors.list_anchors(ex, KEYS))
    assert r.ok and r.anchors == 0 and len(r.noise) == 3


def test_junk_keys_unknown_actors_and_large_objects_are_noise(tmp_path: Path) -> None:
    ex, log = _store(tmp_path), _log(tmp_path, 1)
    _put(ex, "anchors/eu/notes.txt", "hello")
    us = _anchor(log)
    _put(ex, anchors.anchor_key("us", us["seq"], us["sha256"]), {**us, "actor": "us"})
    ex.write_bytes(anchors.anchor_key("eu", 5, "b" * 64), b" " * (anchors.MAX_ANCHOR_BYTES + 1))
    why = {n.key: n.why for n in anchors.list_anchors(ex, KEYS).noise}
    assert "not an anchor key" in why["anchors/eu/notes.txt"]
    assert "no audit service key is known for 'us'" in why[anchors.anchor_key("us", us["seq"], us["sha256"])]
    assert "larger than any anchor" in why[anchors.anchor_key("eu", 5, "b" * 64)]


def test_a_real_rollback_is_still_caught_beside_noise(tmp_path: Path) -> None:
    ex, log = _store(tmp_path), _log(tmp_path, 2)
    saved = {f: f.read_bytes() for f in (log.path, log.path.with_name("eu.jsonl.head"))}
    log.append("data.read", i=99)
    anchors.publish_head(ex, _anchor(log))
    _put(ex, anchors.anchor_key("eu", 10**11, "c" * 64), {"junk": True})
    for f, data in saved.items():
        f.write_bytes(data)
    (r,) = verify_trail({"eu": (log.path, log.key)}, anchors.list_anchors(ex, KEYS))
    assert not r.ok and "rolled back or deleted" in r.reason and "seq 2" in r.reason, r.reason


def test_the_service_chains_its_anchors_and_repeats_one_for_an_unmoved_head(tmp_path: Path) -> None:
    log = _log(tmp_path, 2)
    first = _anchor(log)
    assert first["prev"] == sig.GENESIS and _anchor(log, first) == first
    log.append("data.read", i=2)
    second = _anchor(log, first)
    assert second["prev"] == sig.anchor_id(first) and second["seq"] == first["seq"] + 1
    assert sig.refusal(second, "eu", second["seq"], second["sha256"], KEYS["eu"]) == ""


def test_a_fork_in_the_chain_is_caught(tmp_path: Path) -> None:
    ex, log = _store(tmp_path), _log(tmp_path, 2)
    first = _anchor(log)
    log.append("data.read", i=2)
    anchors.publish_head(ex, first)
    anchors.publish_head(ex, _anchor(log, first))
    log.append("data.read", i=3)
    anchors.publish_head(ex, _anchor(log, first))  # signed after `first` again: the service's record rolled back
    (r,) = verify_trail({"eu": (log.path, log.key)}, anchors.list_anchors(ex, KEYS))
    assert not r.ok and "forked" in r.reason, r.reason


def test_an_anchor_is_never_written_over(tmp_path: Path) -> None:
    ex, log = _store(tmp_path), _log(tmp_path, 1)
    a = _anchor(log)
    key = anchors.publish(ex, a, phase="prepare")
    before = (tmp_path / "exchange" / key).read_bytes()
    with pytest.raises(FileExistsError):
        ex.write_new(key, b"{}")
    assert anchors.publish(ex, a, phase="train") == key  # the same head again: left as it is
    assert (tmp_path / "exchange" / key).read_bytes() == before


def test_the_service_keys_file_is_public_and_read_back(tmp_path: Path) -> None:
    f = tmp_path / "keys.json"
    sig.write_service_keys(f, KEYS)
    assert f.stat().st_mode & 0o777 == 0o644
    assert sig.load_service_keys({sig.ENV_AUDIT_SERVICE_KEYS: str(f)}) == KEYS
    assert sig.load_service_keys({}) == {}
    f.write_text(json.dumps({"eu": "zz"}))
    with pytest.raises(ValueError, match="64 hex"):
        sig.load_service_keys({sig.ENV_AUDIT_SERVICE_KEYS: str(f)})


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[AuditClient, Path]]:
    cfg, log, sock = tmp_path / "service.json", tmp_path / "eu.jsonl", tmp_path / "eu.sock"
    cfg.write_text(json.dumps({"actor": "eu", "log": str(log), "key": new_key().hex(), "socket": str(sock),
                               "allowed_uids": [os.getuid()], "signing_key": SERVICE}))
    proc = subprocess.Popen([sys.executable, "-m", "insitu.governance.audit_service", "--config", str(cfg)],
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert time.monotonic() < deadline and proc.poll() is None, "audit service did not start"
            time.sleep(0.05)
        yield AuditClient(sock, "eu", log), log
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_audit_service_signs_its_heads_in_one_chain(service: tuple[AuditClient, Path]) -> None:
    client, log = service
    first = client.anchor()
    assert first is not None and (first["seq"], first["sha256"]) == client.head()
    assert sig.refusal(first, "eu", first["seq"], first["sha256"], KEYS["eu"]) == ""
    assert client.anchor() == first  # nothing new to vouch for
    client.append("data.read", shard="eu-000")
    second = client.anchor()
    assert second is not None and second["prev"] == sig.anchor_id(first)
    assert json.loads(log.with_name("eu.jsonl.anchor").read_text()) == second  # kept by the service, not the site
