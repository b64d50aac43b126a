"""The IAM policy documents: shapes, and what they allow under AWS's (and moto's) wildcard rules."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest

from insitu.governance.iam import (
    COORDINATOR,
    exchange_coordinator_policy,
    exchange_site_policy,
    no_auth_action_count,
    site_store_policy,
)

EX = "insitu-exchange"
SITES = ("eu", "us", "apac")
KINDS = ("plan", "stats", "weights", "update", "metrics", "summary", "control")


def decide(policy: dict[str, Any], action: str, resource: str) -> bool:
    """AWS's evaluation for one identity policy: an explicit Deny wins, else any Allow, else deny.

    ``*`` matches any run of characters, '/' included (AWS and moto agree; moto reads '?' differently,
    which the policies never use).
    """
    allowed = False
    for st in policy["Statement"]:
        if action not in st["Action"] or not any(
            re.fullmatch(re.escape(r).replace(r"\*", ".*"), resource) for r in st["Resource"]
        ):
            continue
        if st["Effect"] == "Deny":
            return False
        allowed = True
    return allowed


def obj(key: str, bucket: str = EX) -> str:
    return f"arn:aws:s3:::{bucket}/{key}"


def all_statements() -> list[dict[str, Any]]:
    policies = [site_store_policy("insitu-eu"), exchange_coordinator_policy(EX)]
    policies += [exchange_site_policy(EX, s) for s in SITES]
    return [st for p in policies for st in p["Statement"]]


def test_documents_are_plain_iam_json() -> None:
    for policy in (site_store_policy("insitu-eu"), exchange_site_policy(EX, "eu"), exchange_coordinator_policy(EX)):
        assert json.loads(json.dumps(policy)) == policy
        assert policy["Version"] == "2012-10-17"
        sids = [st["Sid"] for st in policy["Statement"]]
        assert len(set(sids)) == len(sids) and all(s.isalnum() for s in sids)


def test_no_condition_no_question_mark_no_s3_star() -> None:
    # moto ignores Condition and reads '?' as a regex quantifier: either would make moto and AWS disagree.
    for st in all_statements():
        assert set(st) == {"Sid", "Effect", "Action", "Resource"}
        assert not any("?" in r for r in st["Resource"])
        assert all(re.fullmatch(r"s3:[A-Z][A-Za-z]+", a) for a in st["Action"])  # moto matches case-sensitively


def test_site_store_policy_covers_its_bucket_only() -> None:
    p = site_store_policy("insitu-eu")
    resources = {r for st in p["Statement"] for r in st["Resource"]}
    assert resources == {"arn:aws:s3:::insitu-eu", "arn:aws:s3:::insitu-eu/*"}
    for action in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"):
        assert decide(p, action, "arn:aws:s3:::insitu-eu/any/deep/key.parquet")
        assert not decide(p, action, "arn:aws:s3:::insitu-us/any/deep/key.parquet")
    assert decide(p, "s3:ListBucket", "arn:aws:s3:::insitu-eu")
    assert not decide(p, "s3:ListBucket", "arn:aws:s3:::insitu-us")
    for config in ("s3:PutReplicationConfiguration", "s3:PutBucketPolicy", "s3:DeleteBucket", "s3:CreateBucket"):
        assert not decide(p, config, "arn:aws:s3:::insitu-eu")


@pytest.mark.parametrize("site", SITES)
def test_exchange_site_writes_only_its_own_prefix(site: str) -> None:
    p = exchange_site_policy(EX, site)
    for kind in KINDS:
        for writer in (*SITES, COORDINATOR):
            key = f"jobs/j1/{kind}/{writer}/r-1.pt"
            for action in ("s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"):
                assert decide(p, action, obj(key)) == (writer == site), (action, key)


@pytest.mark.parametrize("site", SITES)
def test_exchange_site_reads_its_own_and_the_coordinators_shared_kinds(site: str) -> None:
    p = exchange_site_policy(EX, site)
    for kind in KINDS:
        assert decide(p, "s3:GetObject", obj(f"jobs/j/{kind}/{site}/x.json"))
        shared = kind in ("weights", "stats", "control", "plan")
        assert decide(p, "s3:GetObject", obj(f"jobs/j/{kind}/{COORDINATOR}/x.json")) == shared
        for other in SITES:
            if other != site:
                assert not decide(p, "s3:GetObject", obj(f"jobs/j/{kind}/{other}/x.json"))
    assert decide(p, "s3:ListBucket", f"arn:aws:s3:::{EX}")


def test_wildcards_span_slashes_so_deeper_keys_are_denied() -> None:
    eu, coord = exchange_site_policy(EX, "eu"), exchange_coordinator_policy(EX)
    # Both would match the Allow patterns ('*' spans '/') and land under someone else's prefix.
    assert not decide(eu, "s3:PutObject", obj("jobs/j/update/us/eu/x.pt"))
    assert not decide(eu, "s3:PutObject", obj("jobs/j/control/coordinator/eu/abort.json"))
    assert not decide(eu, "s3:GetObject", obj("jobs/j/update/us/eu/x.pt"))
    assert not decide(coord, "s3:PutObject", obj("jobs/j/update/eu/coordinator/x.pt"))
    # A job id may hold dots and dashes; the layout's own keys stay allowed.
    assert decide(eu, "s3:PutObject", obj("jobs/fraud-2026.12.01/update/eu/round-3.manifest.json"))


def test_exchange_coordinator_policy() -> None:
    p = exchange_coordinator_policy(EX)
    for kind in KINDS:
        for writer in (*SITES, COORDINATOR):
            key = obj(f"jobs/j/{kind}/{writer}/x")
            assert decide(p, "s3:GetObject", key)
            assert decide(p, "s3:PutObject", key) == (writer == COORDINATOR)
            assert decide(p, "s3:DeleteObject", key) == (writer == COORDINATOR)
    assert not decide(p, "s3:GetObject", obj("elsewhere/x"))
    assert decide(p, "s3:ListBucket", f"arn:aws:s3:::{EX}")


def test_fits_aws_inline_user_policy_limit() -> None:
    # AWS caps a user's inline policies at 2,048 characters in all (whitespace not counted).
    for site in SITES:
        total = sum(len(json.dumps(p, separators=(",", ":")))
                    for p in (site_store_policy(f"insitu-{site}"), exchange_site_policy(EX, site)))
        assert total <= 2048


@pytest.mark.parametrize("bad", ["", "e/u", "*", "e?", " eu"])
def test_rejects_names_that_would_widen_a_pattern(bad: str) -> None:
    with pytest.raises(ValueError):
        exchange_site_policy(EX, bad)
    with pytest.raises(ValueError):
        site_store_policy(bad or "x/y")


def test_rejects_coordinator_as_site_and_short_bucket() -> None:
    with pytest.raises(ValueError, match="coordinator"):
        exchange_site_policy(EX, COORDINATOR)
    with pytest.raises(ValueError, match="3 to 63"):
        exchange_coordinator_policy("ab")


def test_no_auth_action_count() -> None:
    assert no_auth_action_count(0) == 1
    assert no_auth_action_count(4) == 13  # the exchange: three sites and the coordinator
    with pytest.raises(ValueError):
        no_auth_action_count(-1)


def test_importing_does_not_import_boto3() -> None:
    code = "import sys, insitu.governance.iam; sys.exit('boto3' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_the_exchange_bucket_policy_makes_anchors_write_once_on_aws() -> None:
    from insitu.governance.iam import exchange_bucket_policy

    put, delete = exchange_bucket_policy("insitu-exchange")["Statement"]
    assert put["Effect"] == "Deny" and put["Action"] == ["s3:PutObject"] and put["Principal"] == "*"
    assert put["Resource"] == ["arn:aws:s3:::insitu-exchange/anchors/*"]
    assert put["Condition"] == {"Null": {"s3:if-none-match": "true"}}  # only conditional writes: no overwrite
    assert delete["Effect"] == "Deny" and "s3:DeleteObject" in delete["Action"] and "Condition" not in delete
