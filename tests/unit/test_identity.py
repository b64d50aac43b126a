"""An actor's identity comes only from its own owner-only file; runtime overrides and foreign pools are refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from insitu.governance.audit import new_key, read_events, verify
from insitu.governance.identity import (
    ENV_IDENTITY,
    RULE_POOL,
    RULE_RUNTIME_OVERRIDE,
    Identity,
    IdentityError,
    check_pool,
    load_identity,
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
