"""The site guard: a site admits only shards pinned to it, and audits every refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from insitu.conf import DatasetConfig, load_conf
from insitu.governance.audit import AuditLog, new_key, read_events, verify
from insitu.governance.residency import (
    RULE_PINNED,
    RULE_UNKNOWN,
    ResidencyError,
    admit_shards,
)


@pytest.fixture(scope="module")
def dataset(conf_dir: Path) -> DatasetConfig:
    return load_conf("fraud", directory=conf_dir).dataset


@pytest.fixture
def audit(tmp_path: Path) -> AuditLog:
    return AuditLog(tmp_path / "audit" / "us.jsonl", new_key(), actor="us")


def _admit(site: str, requested: list[str] | None, dataset: DatasetConfig, audit: AuditLog) -> list[str]:
    shards = admit_shards(site, requested, "fraud", dataset, audit, "coordinator", "job-7", "run-abc")
    return [s.id for s in shards]


def test_none_means_own_shards(dataset: DatasetConfig, audit: AuditLog) -> None:
    assert _admit("us", None, dataset, audit) == ["us-000", "us-001"]
    assert _admit("apac", None, dataset, audit) == ["apac-000", "apac-001", "apac-002"]
    assert _admit("nowhere", None, dataset, audit) == []
    assert read_events(audit.path) == []


def test_own_shards_admitted_in_request_order(dataset: DatasetConfig, audit: AuditLog) -> None:
    assert _admit("us", ["us-001", "us-000"], dataset, audit) == ["us-001", "us-000"]
    assert read_events(audit.path) == []


def test_foreign_shard_refused_and_audited(dataset: DatasetConfig, audit: AuditLog) -> None:
    with pytest.raises(ResidencyError) as info:
        _admit("us", ["us-000", "eu-000"], dataset, audit)
    msg = str(info.value)
    assert "site 'us'" in msg
    assert "shard 'eu-000'" in msg
    assert "pinned to site 'eu'" in msg
    assert RULE_PINNED in msg
    assert "'coordinator'" in msg and "job-7" in msg

    events = read_events(audit.path)
    assert len(events) == 1
    ev = events[0]
    assert ev["event"] == "residency.refused" and ev["actor"] == "us"
    assert ev["fields"] == {
        "shard": "eu-000",
        "dataset": "fraud",
        "principal": "coordinator",
        "job_id": "job-7",
        "flow_run_id": "run-abc",
        "rule": RULE_PINNED,
        "pinned_to": "eu",
        "reason": msg,
    }
    res = verify(audit.path, audit.key)
    assert res.ok and res.lines == 1, res.reason


def test_undeclared_shard_refused_with_other_rule(dataset: DatasetConfig, audit: AuditLog) -> None:
    with pytest.raises(ResidencyError, match=RULE_UNKNOWN) as info:
        _admit("us", ["us-999"], dataset, audit)
    assert "not declared" in str(info.value) and "'us-999'" in str(info.value)
    assert RULE_PINNED not in str(info.value)
    events = read_events(audit.path)
    assert len(events) == 1
    assert events[0]["fields"]["rule"] == RULE_UNKNOWN
    assert events[0]["fields"]["pinned_to"] is None
    assert events[0]["fields"]["shard"] == "us-999"
    assert verify(audit.path, audit.key).ok


def test_each_refusal_appends_to_the_chain(dataset: DatasetConfig, audit: AuditLog) -> None:
    for shard in ("eu-000", "apac-002", "ghost"):
        with pytest.raises(ResidencyError):
            _admit("us", [shard], dataset, audit)
    events = read_events(audit.path)
    assert [e["fields"]["shard"] for e in events] == ["eu-000", "apac-002", "ghost"]
    assert [e["fields"]["pinned_to"] for e in events] == ["eu", "apac", None]
    assert [e["seq"] for e in events] == [0, 1, 2]
    assert verify(audit.path, audit.key).ok
