"""A local S3 endpoint keeps what it acknowledged: killed with SIGKILL and started again on the same data
directory, it serves the same objects under the same keys, refuses the same requests, and needs no new set-up.

The endpoint is the platform's (``python -m deployments.platform.s3 --data DIR``), provisioned as the platform does
(:func:`insitu.governance.iam.provision`), driven over HTTP by s3fs and boto3. The platform-level story (``insitu
down``/``up`` and a store killed mid-job) is ``test_platform_restart.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError
from s3_endpoint import S3Endpoint

from insitu.governance.iam import (
    exchange_coordinator_policy,
    exchange_site_policy,
    no_auth_action_count,
    provision,
    site_store_policy,
)

pytestmark = pytest.mark.e2e
EX = "insitu-exchange"


def Endpoint(data: Path, log: Path) -> S3Endpoint:  # noqa: N802 (reads as the class it returns)
    """The platform's S3 endpoint on ``data``, with the exchange's write-once prefix, as the platform starts it."""
    return S3Endpoint(log, no_auth_action_count(4), data=data, write_once="anchors/")


def test_a_killed_endpoint_comes_back_with_every_acknowledged_object_and_its_keys(tmp_path: Path) -> None:
    data, log = tmp_path / "store", tmp_path / "s3.log"
    first = Endpoint(data, log)
    try:
        # "owner": a site store's policy (the one that may send DeleteObjects, as s3fs rm does)
        keys = provision(first.url, EX, {"coordinator": exchange_coordinator_policy(EX), "owner": site_store_policy(EX),
                                         "eu": exchange_site_policy(EX, "eu"), "us": exchange_site_policy(EX, "us")})
        eu, coord = first.fs(keys["eu"]), first.fs(keys["coordinator"])
        big = os.urandom(12 * 2**20)  # past s3fs's 5 MiB blocks: a multipart upload
        with eu.open(f"{EX}/jobs/j/update/eu/big.pt", "wb", block_size=5 * 2**20) as f:
            f.write(big)
        eu.pipe_file(f"{EX}/jobs/j/stats/eu/prepare.json", b'{"rows": 1}')
        eu.pipe_file(f"{EX}/jobs/j/stats/eu/gone.json", b"x")
        eu.rm_file(f"{EX}/jobs/j/stats/eu/gone.json")
        coord.copy(f"{EX}/jobs/j/update/eu/big.pt", f"{EX}/jobs/j/global/coordinator/copy.pt")
        owner = first.fs(keys["owner"])
        owner.pipe({f"{EX}/raw/{i}.csv": b"t" for i in range(3)})
        owner.rm([f"{EX}/raw/{i}.csv" for i in range(3)])  # one DeleteObjects request
        assert not owner.exists(f"{EX}/raw/0.csv")
        eu.pipe_file(f"{EX}/anchors/eu/1.json", b"anchor")
        before = {p: coord.cat_file(p) for p in coord.find(f"{EX}/")}
    finally:
        first.kill()

    second = Endpoint(data, log)
    try:
        eu, us, coord = second.fs(keys["eu"]), second.fs(keys["us"]), second.fs(keys["coordinator"])
        after = {p: coord.cat_file(p) for p in coord.find(f"{EX}/")}
        assert after == before and len(after) == 4, sorted(after)
        assert after[f"{EX}/jobs/j/update/eu/big.pt"] == big
        # The same policies: a site still writes only under its own prefix, and reads no other site's update.
        with pytest.raises(PermissionError):
            us.pipe_file(f"{EX}/jobs/j/stats/eu/prepare.json", b"forged")
        # The same write-once anchors.
        with pytest.raises(PermissionError):
            eu.pipe_file(f"{EX}/anchors/eu/1.json", b"rewritten")
        # No unauthenticated set-up window after a restore: a made-up key is refused from the first request.
        made_up = boto3.client("s3", endpoint_url=second.url, region_name="us-east-1",
                               aws_access_key_id="setup", aws_secret_access_key="setup")
        with pytest.raises(ClientError) as refused:
            made_up.create_bucket(Bucket="attacker")
        assert refused.value.response["Error"]["Code"] in {"InvalidAccessKeyId", "InvalidClientTokenId",
                                                           "AccessDenied", "SignatureDoesNotMatch"}
        # A new object after the restart is kept too.
        eu.pipe_file(f"{EX}/jobs/j/stats/eu/after.json", b"{}")
    finally:
        second.stop()
    third = Endpoint(data, log)
    try:
        assert third.fs(keys["coordinator"]).cat_file(f"{EX}/jobs/j/stats/eu/after.json") == b"{}"
    finally:
        third.stop()
    assert not list((data / "objects").glob("*.tmp"))
    assert oct((data / "setup.json").stat().st_mode & 0o777) == "0o600"
