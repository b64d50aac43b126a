"""The audit trail on the running platform: a site's log rolled back or deleted is caught by its anchors,
and the whole trail exports as one timeline."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import typer
from platform_helpers import run_dispatched

from deployments.cli import audit_timeline, audit_verify
from deployments.platform import Platform
from insitu.governance.anchors import list_anchors
from insitu.governance.audit import verify
from insitu.governance.trail import verify_trail
from insitu.storage import store_from_env

pytestmark = pytest.mark.e2e


def _prepare(p: Platform, site: str, job_id: str, request: dict[str, Any]) -> None:
    fr = run_dispatched(p, f"site-prepare/{site}", {"job_id": job_id, "request": request})
    assert fr.state.is_completed(), fr.state.message


def _trail(p: Platform) -> dict[str, Any]:
    stored = list_anchors(store_from_env(p.sites.exchange, "exchange"), p.audit_service_keys())
    return {r.actor: r for r in verify_trail({a: (p.audit_log(a), p.audit_key(a)) for a in p.actors}, stored)}


def _snapshot(log: Path) -> dict[Path, bytes]:
    return {f: f.read_bytes() for f in (log, log.with_name(log.name + ".head"))}


def _restore(files: dict[Path, bytes]) -> None:
    """Write the contents back into the same files (same owner and mode: the audit service keeps writing)."""
    for f, data in files.items():
        f.write_bytes(data)


def _set_aside(log: Path) -> list[Path]:
    """Move a log and its head away (renamed: their owner and mode survive the round trip)."""
    moved = []
    for f in (log, log.with_name(log.name + ".head")):
        f.rename(f.with_name(f.name + ".aside"))
        moved.append(f)
    return moved


def _put_back(moved: list[Path]) -> None:
    for f in moved:
        f.unlink(missing_ok=True)
        f.with_name(f.name + ".aside").rename(f)


def test_a_site_log_rolled_back_with_its_head_is_caught_by_its_anchor(deployed: Platform, signer: Any) -> None:
    log = deployed.audit_log("eu")
    before = _snapshot(log)
    job_id = f"e2e-rollback-{uuid.uuid4().hex[:6]}"
    _prepare(deployed, "eu", job_id, signer(job_id=job_id))  # admitted, reads data, anchors eu's head on the exchange
    assert _trail(deployed)["eu"].ok, _trail(deployed)["eu"].reason
    after = _snapshot(log)
    _restore(before)  # the site's host rolls its log and head back to a copy from before the job
    try:
        assert verify(log, deployed.audit_key("eu")).ok  # on its own the old copy is consistent ...
        r = _trail(deployed)["eu"]
        assert not r.ok and "rolled back or deleted" in r.reason, r.reason  # ... but not with its anchor
        with pytest.raises(typer.Exit):
            audit_verify(state_dir=deployed.dir, conf=deployed.conf_dir, actor=[], skip_anchors=False)
    finally:
        _restore(after)
    assert _trail(deployed)["eu"].ok


def test_a_deployed_actors_deleted_log_fails_verification(deployed: Platform) -> None:
    moved = _set_aside(deployed.audit_log("us"))
    try:
        r = _trail(deployed)["us"]
        assert not r.ok and "log missing" in r.reason
    finally:
        _put_back(moved)
    assert _trail(deployed)["us"].ok


def test_the_timeline_of_a_job_shows_who_did_what_on_which_site(deployed: Platform, signer: Any,
                                                                  tmp_path: Path) -> None:
    job_id = f"e2e-timeline-{uuid.uuid4().hex[:6]}"
    _prepare(deployed, "apac", job_id, signer(job_id=job_id))
    out = tmp_path / "timeline.jsonl"
    audit_timeline(state_dir=deployed.dir, conf=deployed.conf_dir, job=job_id, dataset=None, principal=None,
                   fmt="jsonl", out=out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["ts"] for r in rows] == sorted(r["ts"] for r in rows)
    events = [(r["log"], r["event"], r["principal"]) for r in rows]
    assert ("apac", "policy.decision", "alice") in events and ("apac", "data.read", "alice") in events
    assert {r["job_id"] for r in rows} == {job_id}


def test_a_site_log_re_signed_with_a_key_of_its_own_choosing_fails_verification(deployed: Platform) -> None:
    """The site's processes never see its audit key, so a forger re-signs with another one: caught."""
    from insitu.governance.audit import AuditLog, new_key, read_events

    log = deployed.audit_log("apac")
    events = read_events(log)
    moved = _set_aside(log)
    forged = AuditLog(log, new_key(), "apac")
    for e in events:
        if e["event"] != "data.read":  # drop the record of what was read, keep the rest consistent
            forged.append(e["event"], **e["fields"])
    try:
        r = _trail(deployed)["apac"]
        assert not r.ok and "HMAC mismatch" in r.reason, r.reason
    finally:
        _put_back(moved)
    assert _trail(deployed)["apac"].ok
