"""Policy versions only grow: the pure rules of ``insitu.governance.policy_version``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from insitu.governance.policy_version import (
    RULE_VERSION,
    PolicyVersionError,
    accepted_record,
    bundle_sha256,
    installed_refusal,
    read_record,
    record_path,
    version_refusal,
)


def test_nothing_accepted_yet_accepts_any_version() -> None:
    assert version_refusal("eu", 1, "a" * 64, None) == ""


def test_a_higher_version_is_accepted_a_lower_one_never() -> None:
    rec = accepted_record("eu", 2, "b" * 64, "eu-admin")
    assert version_refusal("eu", 3, "c" * 64, rec) == ""
    why = version_refusal("eu", 1, "a" * 64, rec)
    assert "refuses policy v1" in why and "already accepted v2" in why and RULE_VERSION in why
    assert "insitu policy apply" in why  # the fix


def test_the_same_version_only_with_the_same_bytes() -> None:
    rec = accepted_record("eu", 2, "b" * 64, "eu-admin")
    assert version_refusal("eu", 2, "b" * 64, rec) == ""  # a restart re-installs what was accepted
    why = version_refusal("eu", 2, "d" * 64, rec)
    assert "another policy with that version" in why and "v3" in why and RULE_VERSION in why


def test_the_record_fails_closed_when_unreadable(tmp_path: Path) -> None:
    assert read_record(tmp_path / "none.json") is None
    bad = tmp_path / "accepted.json"
    bad.write_text("{not json")
    with pytest.raises(PolicyVersionError, match=RULE_VERSION):
        read_record(bad)
    bad.write_text(json.dumps({"version": "2"}))
    with pytest.raises(PolicyVersionError, match="malformed"):
        read_record(bad)


def test_an_older_policy_put_back_on_disk_is_refused_at_load(tmp_path: Path) -> None:
    policy = tmp_path / "policy.json"
    v2 = '{"policy": {"version": 2}}'
    policy.write_text(v2)
    record_path(policy).write_text(json.dumps(accepted_record("eu", 2, bundle_sha256(v2), "eu-admin")))
    assert installed_refusal(policy, "eu", 2) == ""
    policy.write_text('{"policy": {"version": 1}}')  # an older signed bundle copied over it
    assert "refuses policy v1" in installed_refusal(policy, "eu", 1)
    record_path(policy).write_text("garbage")
    assert RULE_VERSION in installed_refusal(policy, "eu", 2)
