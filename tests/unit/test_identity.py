"""An actor's identity comes only from its own owner-only file; runtime overrides and foreign pools are refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from insitu.governance.audit import new_key, read_events, verify
from insitu.governance.identity import (
    ENV_IDENTITY,
    RULE_ADMIN_OWNED,
    RULE_POOL,
    RULE_RUNTIME_OVERRIDE,
    Identity,
    IdentityError,
    check_pool,
    load_identity,
    ownership_refusal,
    refuse_runtime_overrides,
    runtime_overrides,
    write_identity,
)


def _identity(tmp_path: Path) -> Identity:
    return Identity(actor="eu", role="site", work_pool="insitu-eu", audit_log=tmp_path / "audit" / "eu.jsonl",
                    audit_key=new_key(), path=tmp_path / "identity.json")


def test_round_trip_owner_only(tmp_path: Path) -> None:
    ident = _identity(tmp_path)
    write_identity(ident.path, ident)
    assert (ident.path.stat().st_mode & 0o777) == 0o600
    loaded = load_identity({ENV_IDENTITY: str(ident.path)})
    assert loaded == ident


def test_unset_missing_or_malformed_is_refused(tmp_path: Path) -> None:
    with pytest.raises(IdentityError, match="INSITU_IDENTITY is not set"):
        load_identity({})
    with pytest.raises(IdentityError, match="no such file"):
        load_identity({ENV_IDENTITY: str(tmp_path / "nope.json")})
    bad = tmp_path / "bad.json"
    bad.write_text('{"actor": "eu", "role": "admin", "work_pool": "p", "audit_log": "x", "audit_key": "00"}')
    bad.chmod(0o600)
    with pytest.raises(IdentityError, match="malformed.*role 'admin'"):
        load_identity({ENV_IDENTITY: str(bad)})


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o606, 0o620])
def test_a_file_others_can_read_or_write_is_refused(tmp_path: Path, mode: int) -> None:
    ident = _identity(tmp_path)
    write_identity(ident.path, ident)
    ident.path.chmod(mode)
    with pytest.raises(IdentityError, match=f"mode {mode:04o}.*chmod 600"):
        load_identity({ENV_IDENTITY: str(ident.path)})


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file to another user")
def test_a_file_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    ident = _identity(tmp_path)
    write_identity(ident.path, ident, uid=65534, gid=65534)
    with pytest.raises(IdentityError, match="owned by uid 65534"):
        load_identity({ENV_IDENTITY: str(ident.path)})


def test_runtime_overrides_are_refused_and_audited(tmp_path: Path) -> None:
    ident = _identity(tmp_path)
    env = {"PATH": "/bin", "PREFECT__RUNTIME__DEPLOYMENT__ID": "x", "prefect__runtime__flow_run__id": "y"}
    assert runtime_overrides(env) == ["PREFECT__RUNTIME__DEPLOYMENT__ID", "prefect__runtime__flow_run__id"]
    refuse_runtime_overrides(ident, "fr-1", {"PATH": "/bin"})  # nothing to refuse
    with pytest.raises(IdentityError, match="PREFECT__RUNTIME__DEPLOYMENT__ID"):
        refuse_runtime_overrides(ident, "fr-1", env)
    (event,) = read_events(ident.audit_log)
    assert event["event"] == "run.refused" and event["fields"]["rule"] == RULE_RUNTIME_OVERRIDE
    assert event["fields"]["flow_run_id"] == "fr-1"
    assert verify(ident.audit_log, ident.audit_key).ok


def test_a_run_from_another_pool_is_refused_and_audited(tmp_path: Path) -> None:
    ident = _identity(tmp_path)
    check_pool(ident, "insitu-eu", "fr-1", "job")
    for pool in ("insitu-us", None):
        with pytest.raises(IdentityError, match=f"work pool {pool!r}"):
            check_pool(ident, pool, "fr-2", "job")
    events = read_events(ident.audit_log)
    assert [e["fields"]["rule"] for e in events] == [RULE_POOL, RULE_POOL]
    assert events[0]["fields"]["run_pool"] == "insitu-us"


def test_writing_never_follows_a_planted_link(tmp_path: Path) -> None:
    ident = _identity(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "identity.json.tmp").symlink_to(victim)
    write_identity(ident.path, ident)
    assert victim.read_text() == "precious"
    assert load_identity({ENV_IDENTITY: str(ident.path)}) == ident


# --------------------------------------------------------------------------- owned by the site's admin identity
def test_an_audit_service_must_be_pinned(tmp_path: Path) -> None:
    raw = _identity(tmp_path).to_json().replace('"audit_key"', '"audit_socket": "/x.sock", "unused"')
    with pytest.raises(IdentityError, match="audit_service_key"):
        Identity.from_json(raw, tmp_path / "identity.json")
    pinned = Identity(actor="eu", role="site", work_pool="insitu-eu", audit_log=tmp_path / "eu.jsonl", audit_key=None,
                      path=tmp_path / "identity.json", audit_socket=Path("/x.sock"), audit_service_key="ab" * 32,
                      admin="nobody")
    assert Identity.from_json(pinned.to_json(), pinned.path) == pinned


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to another user")
def test_an_admin_owned_identity_is_read_not_written_by_the_runtime(tmp_path: Path) -> None:
    import pwd

    admin = pwd.getpwnam("nobody")
    me = 4242  # the runtime: neither the file's nor its directory's owner
    d = tmp_path / "admin"
    d.mkdir()
    os.chown(d, admin.pw_uid, admin.pw_gid)
    d.chmod(0o750)
    ident = Identity(actor="eu", role="site", work_pool="insitu-eu", audit_log=tmp_path / "eu.jsonl", audit_key=None,
                     path=d / "identity.json", audit_socket=Path("/x.sock"), audit_service_key="ab" * 32,
                     admin="nobody")
    write_identity(ident.path, ident, admin.pw_uid, admin.pw_gid, 0o640)
    assert ownership_refusal(ident.path, ident.path.stat(), "nobody", me) == ""
    os.chown(ident.path, me, admin.pw_gid)
    assert RULE_ADMIN_OWNED in ownership_refusal(ident.path, ident.path.stat(), "nobody", me)
    os.chown(ident.path, admin.pw_uid, admin.pw_gid)
    ident.path.chmod(0o660)  # the runtime's group could write it
    assert "chmod 640" in ownership_refusal(ident.path, ident.path.stat(), "nobody", me)
    ident.path.chmod(0o640)
    os.chown(d, me, admin.pw_gid)  # the runtime owns the directory: it could swap the file
    assert "could replace the file" in ownership_refusal(ident.path, ident.path.stat(), "nobody", me)
