"""The audit trail across actors: missing logs, rollbacks and rewrites caught by anchors; the merged timeline."""

from __future__ import annotations

import shutil
from pathlib import Path

from insitu.governance import anchor_signing, anchors
from insitu.governance.audit import AuditLog, new_key, verify
from insitu.governance.trail import timeline, to_csv, to_jsonl, verify_trail
from insitu.storage import Store


def _log(d: Path, actor: str, key: bytes, n: int, job: str = "j1") -> AuditLog:
    log = AuditLog(d / f"{actor}.jsonl", key, actor)
    for i in range(n):
        log.append("data.read", job_id=job, dataset="fraud", principal="alice", i=i)
    return log


SERVICE = anchor_signing.new_service_key()
KEYS = {"eu": anchor_signing.public_hex(SERVICE)}


def _signed(log: AuditLog) -> dict:
    """What eu's audit service answers to ``{op: anchor}``: its head, signed by the service's key."""
    h = log.head()
    assert h is not None
    return anchor_signing.sign_anchor(anchor_signing.private_key(SERVICE), log.actor, h[0], h[1])


def _store(tmp_path: Path) -> Store:
    (tmp_path / "exchange").mkdir()
    return Store(f"file://{tmp_path / 'exchange'}/")


def test_a_missing_log_fails_only_when_the_actor_is_deployed(tmp_path: Path) -> None:
    assert verify(tmp_path / "eu.jsonl", new_key()).ok
    r = verify(tmp_path / "eu.jsonl", new_key(), required=True)
    assert not r.ok and "log missing" in r.reason


def test_a_log_rolled_back_with_its_head_verifies_alone_but_not_against_its_anchor(tmp_path: Path) -> None:
    key = new_key()
    ex = _store(tmp_path)
    log = _log(tmp_path, "eu", key, 3)
    saved = tmp_path / "saved"
    saved.mkdir()
    for f in ("eu.jsonl", "eu.jsonl.head"):
        shutil.copy(tmp_path / f, saved / f)
    log.append("data.read", job_id="j2", dataset="fraud", principal="alice")
    anchors.publish_head(ex, _signed(log), job_id="j2")
    for f in ("eu.jsonl", "eu.jsonl.head"):  # roll both back to the copy taken before j2
        shutil.copy(saved / f, tmp_path / f)
    assert verify(log.path, key).ok
    (r,) = verify_trail({"eu": (log.path, key)}, anchors.list_anchors(ex, KEYS))
    assert not r.ok and "rolled back or deleted" in r.reason and "seq 3" in r.reason


def test_a_log_rewritten_and_resigned_from_an_anchored_line_is_caught(tmp_path: Path) -> None:
    key = new_key()
    ex = _store(tmp_path)
    log = _log(tmp_path, "eu", key, 4)
    anchors.publish_head(ex, _signed(log))
    # Someone with the key rewrites history: a fresh, self-consistent log of the same length.
    log.path.unlink()
    log.path.with_name("eu.jsonl.head").unlink()
    forged = _log(tmp_path, "eu", key, 4, job="other")
    assert verify(forged.path, key).ok
    (r,) = verify_trail({"eu": (forged.path, key)}, anchors.list_anchors(ex, KEYS))
    assert not r.ok and "rewritten" in r.reason


def test_a_deleted_log_and_head_are_caught(tmp_path: Path) -> None:
    key = new_key()
    log = _log(tmp_path, "us", key, 2)
    log.path.unlink()
    log.path.with_name("us.jsonl.head").unlink()
    (r,) = verify_trail({"us": (log.path, key)}, anchors.Found())
    assert not r.ok and "log missing" in r.reason


def test_the_coordinators_countersignature_is_an_anchor_for_the_site(tmp_path: Path) -> None:
    ckey, skey = new_key(), new_key()
    site = _log(tmp_path, "eu", skey, 3)
    seq, sha = site.head()  # type: ignore[misc]
    coord = AuditLog(tmp_path / "coordinator.jsonl", ckey, "coordinator")
    coord.append("audit.anchor", job_id="j1", anchored_actor="eu", seq=seq, sha256=sha)
    logs = {"coordinator": (coord.path, ckey), "eu": (site.path, skey)}
    assert all(r.ok for r in verify_trail(logs, anchors.Found()))
    site.path.write_bytes(b"".join(site.path.read_bytes().splitlines(keepends=True)[:2]))
    site.path.with_name("eu.jsonl.head").unlink()
    results = {r.actor: r for r in verify_trail(logs, anchors.Found())}
    assert results["coordinator"].ok and not results["eu"].ok


def test_the_timeline_merges_logs_in_time_order_and_filters(tmp_path: Path) -> None:
    a = _log(tmp_path, "eu", new_key(), 2, job="j1")
    b = _log(tmp_path, "us", new_key(), 1, job="j2")
    a.append("policy.decision", job_id="j2", dataset="fraud", principal="bob", rule="x")
    rows = timeline({"eu": a.path, "us": b.path})
    assert [r["ts"] for r in rows] == sorted(r["ts"] for r in rows) and len(rows) == 4
    assert [r["log"] for r in timeline({"eu": a.path, "us": b.path}, job="j2")] == ["us", "eu"]
    assert [r["rule"] for r in timeline({"eu": a.path, "us": b.path}, principal="bob")] == ["x"]
    assert to_csv(rows).splitlines()[0] == "ts,log,seq,event,job_id,dataset,principal,rule,fields"
    assert len(to_jsonl(rows).splitlines()) == 4
