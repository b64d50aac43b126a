"""IAM policies that make the object stores enforce residency, for moto locally and for AWS.

Each site has a store of its own (bucket ``insitu-<site>``) and everyone shares the exchange (bucket
``insitu-exchange``), laid out as ``jobs/<job_id>/<kind>/<writer>/<name>``. The policy builders here
are pure and return the same documents for both targets: locally :func:`provision` loads them into a
freshly started ``moto_server`` (which then refuses whatever they do not allow), in production they
are attached to the sites' and coordinator's IAM principals.

Behaviour of moto 5.2.5 the policies are written around (measured with a real ``moto_server``):

* ``INITIAL_NO_AUTH_ACTION_COUNT=N`` lets the first N S3 and IAM requests through unauthenticated;
  every request that reaches the authoriser counts, failing ones (a 404 HEAD) included. ``/moto-api/``
  calls (the health check) do not count. :func:`provision` makes exactly
  :func:`no_auth_action_count` such requests; IAM is served on the same port as S3.
* Resource wildcards match across ``/``, as in AWS: ``jobs/*/*/eu/*`` also matches
  ``jobs/j/update/us/eu/x``. The writer segment is pinned by denying keys deeper than the layout.
* ``Condition`` blocks in user policies are ignored (``s3:prefix`` included), so none is used: a
  condition moto ignores would make local tests pass for a policy AWS enforces differently.
* Multi-object delete (``DeleteObjects``, what s3fs ``rm`` sends) is authorised as ``s3:DeleteObject``
  on the *bucket* ARN and the keys are then checked only against a bucket policy. A principal allowed
  to delete under a prefix therefore gets every key back as an error (which s3fs ignores) in moto;
  ``rm_file`` (``DeleteObject``) is checked per key in both moto and AWS.
* ``/moto-api/`` itself is unauthenticated (``reset-auth`` turns checking off, ``data.json`` shows
  the keys): locally the policies catch code that reaches too far, they are no security boundary.
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger(__name__)

VERSION = "2012-10-17"
COORDINATOR = "coordinator"
POLICY_NAME = "insitu"  # the one inline policy each provisioned user gets
REQUESTS_PER_USER = 3  # CreateUser, PutUserPolicy, CreateAccessKey
# What a site may read of the coordinator's output on the exchange (global stats, weights, plan, abort).
COORDINATOR_KINDS_FOR_SITES = ("weights", "stats", "control", "plan")

_WRITE = ["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]  # multipart parts are s3:PutObject


def _check_name(kind: str, value: str) -> None:
    # Names go into ARNs and key patterns: a '/', '*' or '?' would widen what a pattern matches.
    if not value or any(c in value for c in "/*?") or value != value.strip():
        raise ValueError(f"{kind} {value!r} must be one non-empty path segment without '/', '*' or '?'")


def _bucket_arn(bucket: str) -> str:
    _check_name("bucket", bucket)
    if not 3 <= len(bucket) <= 63:
        raise ValueError(f"bucket {bucket!r}: S3 bucket names have 3 to 63 characters")
    return f"arn:aws:s3:::{bucket}"


def _statement(sid: str, actions: list[str], resources: list[str], effect: str = "Allow") -> dict[str, Any]:
    return {"Sid": sid, "Effect": effect, "Action": actions, "Resource": resources}


def _policy(*statements: dict[str, Any]) -> dict[str, Any]:
    return {"Version": VERSION, "Statement": list(statements)}


def _deny_nested(arn: str, actions: list[str]) -> dict[str, Any]:
    # '*' spans '/', so jobs/*/*/eu/* alone would also match jobs/<job>/<kind>/us/eu/<name>: a key
    # under another writer's prefix. Keys have exactly five segments; deny anything deeper.
    return _statement("DenyKeysDeeperThanLayout", actions, [f"{arn}/jobs/*/*/*/*/*"], effect="Deny")


def _anchors(arn: str, writer: str) -> list[dict[str, Any]]:
    # Audit anchors (insitu.governance.anchors) are write-once: each writer may add objects under its own
    # anchors/<writer>/ and nobody may delete one, so a rolled-back audit log cannot take its anchors with it.
    return [
        _statement("AddOwnAuditAnchors", ["s3:PutObject"], [f"{arn}/anchors/{writer}/*"]),
        _statement("AuditAnchorsAreWriteOnce", ["s3:DeleteObject", "s3:DeleteObjectVersion"], [f"{arn}/anchors/*"],
                   effect="Deny"),
    ]


def site_store_policy(bucket: str) -> dict[str, Any]:
    """Policy for a site on its own store: objects and listing of ``bucket``, nothing else.

    Bucket configuration is left out on purpose (no ``s3:*``): replication, bucket policies and ACLs
    are ways for data to leave the site's region or account.

    Parameters
    ----------
    bucket : str
        The site's bucket, e.g. ``insitu-eu``.

    Returns
    -------
    dict
        An IAM policy document.
    """
    arn = _bucket_arn(bucket)
    return _policy(
        _statement("Objects", ["s3:GetObject", *_WRITE, "s3:ListMultipartUploadParts"], [f"{arn}/*"]),
        # GetBucketLocation is s3fs's fallback probe for "does the bucket exist" (makedirs) when
        # HeadBucket is refused: moto authorises HeadBucket as s3:HeadBucket, which is no IAM action.
        _statement("Bucket", ["s3:ListBucket", "s3:GetBucketLocation", "s3:ListBucketMultipartUploads"], [arn]),
        # moto authorises DeleteObjects (s3fs rm, dask overwrite) as s3:DeleteObject on the bucket
        # ARN; AWS checks each key's ARN, so this grants nothing more there.
        _statement("MultiObjectDelete", ["s3:DeleteObject"], [arn]),
    )


def exchange_site_policy(bucket: str, site: str) -> dict[str, Any]:
    """Policy for ``site`` on the exchange: write its own prefix, read it and the coordinator's output.

    Parameters
    ----------
    bucket : str
        The exchange bucket, e.g. ``insitu-exchange``.
    site : str
        The site's name, its writer segment in ``jobs/<job_id>/<kind>/<writer>/<name>``.

    Returns
    -------
    dict
        An IAM policy document.

    Notes
    -----
    ``s3:ListBucket`` is granted on the whole bucket, so a site can list the *names* and sizes of
    other sites' artefacts (never read them). Narrowing it with ``Condition`` ``s3:prefix`` is not
    possible for both targets: moto ignores conditions, and on AWS a HEAD of a missing key answers
    403 instead of 404 without unconditional ``s3:ListBucket``, which makes s3fs ``exists()`` raise.
    """
    _check_name("site", site)
    if site == COORDINATOR:
        raise ValueError(f"{COORDINATOR!r} is the coordinator's writer name, not a site")
    arn = _bucket_arn(bucket)
    own = f"{arn}/jobs/*/*/{site}/*"
    coordinator = [f"{arn}/jobs/*/{kind}/{COORDINATOR}/*" for kind in COORDINATOR_KINDS_FOR_SITES]
    return _policy(
        _statement("WriteOwnPrefix", _WRITE, [own]),
        _statement("ReadOwnAndCoordinator", ["s3:GetObject"], [own, *coordinator]),
        _statement("List", ["s3:ListBucket"], [arn]),
        _deny_nested(arn, ["s3:GetObject", *_WRITE]),
        *_anchors(arn, site),
    )


def exchange_coordinator_policy(bucket: str) -> dict[str, Any]:
    """Policy for the coordinator on the exchange: write its own prefix, read and list every job.

    Parameters
    ----------
    bucket : str
        The exchange bucket, e.g. ``insitu-exchange``.

    Returns
    -------
    dict
        An IAM policy document.
    """
    arn = _bucket_arn(bucket)
    return _policy(
        _statement("WriteOwnPrefix", _WRITE, [f"{arn}/jobs/*/*/{COORDINATOR}/*"]),
        _statement("ReadJobs", ["s3:GetObject"], [f"{arn}/jobs/*", f"{arn}/anchors/*"]),
        _statement("List", ["s3:ListBucket"], [arn]),
        _deny_nested(arn, _WRITE),
        *_anchors(arn, COORDINATOR),
    )


def exchange_bucket_policy(bucket: str) -> dict[str, Any]:
    """Bucket policy for the exchange on AWS: an audit anchor is written once and never written over or deleted.

    Every ``PutObject`` under ``anchors/`` must carry ``If-None-Match: *`` (AWS's conditional-write condition
    key ``s3:if-none-match``), so a write to an existing anchor fails with 412, and a CopyObject there is refused;
    nobody, whatever their IAM policy, may delete one. Pair it with S3 Object Lock in compliance mode on the
    bucket (see docs/security.md), which keeps every version immutable for the retention period. moto ignores
    conditions, so the local exchange enforces the same rule in its endpoint (``deployments.platform.s3_keep``).

    Parameters
    ----------
    bucket : str
        The exchange bucket, e.g. ``insitu-exchange``.

    Returns
    -------
    dict
        A bucket policy document.
    """
    anchors = f"{_bucket_arn(bucket)}/anchors/*"
    return _policy(
        {**_statement("AnchorsOnlyByConditionalWrite", ["s3:PutObject"], [anchors], effect="Deny"),
         "Principal": "*", "Condition": {"Null": {"s3:if-none-match": "true"}}},
        {**_statement("AnchorsAreNeverDeleted", ["s3:DeleteObject", "s3:DeleteObjectVersion"], [anchors],
                      effect="Deny"), "Principal": "*"},
    )


def no_auth_action_count(n_users: int) -> int:
    """``INITIAL_NO_AUTH_ACTION_COUNT`` for a moto server that :func:`provision` sets up for ``n_users``.

    Parameters
    ----------
    n_users : int
        How many users :func:`provision` will create.

    Returns
    -------
    int
        One CreateBucket plus :data:`REQUESTS_PER_USER` IAM calls per user; every later request is
        authenticated and checked against the users' policies.
    """
    if n_users < 0:
        raise ValueError(f"n_users must be >= 0, not {n_users}")
    return 1 + REQUESTS_PER_USER * n_users


def provision(endpoint: str, bucket: str, users: dict[str, dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """Create ``bucket`` and one IAM user per entry, with its inline policy and a moto-made access key.

    The server must be fresh and started with ``INITIAL_NO_AUTH_ACTION_COUNT`` equal to
    ``no_auth_action_count(len(users))``, and be provisioned once. The calls run in moto's
    unauthenticated phase; the last one checks that the phase is over.

    Parameters
    ----------
    endpoint : str
        The moto server's URL, e.g. ``http://127.0.0.1:9101`` (IAM is served on the same port).
    bucket : str
        The bucket to create.
    users : dict of str to dict
        User name to the IAM policy document it gets.

    Returns
    -------
    dict of str to tuple of (str, str)
        User name to ``(access_key_id, secret_access_key)``.

    Raises
    ------
    RuntimeError
        If the server was not in its unauthenticated phase for all the setup calls, or still is after.
    """
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    _bucket_arn(bucket)
    # One attempt per call: a retried request would be counted twice against the no-auth budget.
    kw: dict[str, Any] = {"endpoint_url": endpoint, "region_name": "us-east-1", "aws_access_key_id": "setup",
                          "aws_secret_access_key": "setup", "config": Config(retries={"total_max_attempts": 1})}
    s3, iam = boto3.client("s3", **kw), boto3.client("iam", **kw)
    keys: dict[str, tuple[str, str]] = {}
    try:
        s3.create_bucket(Bucket=bucket)
        for user, policy in users.items():
            iam.create_user(UserName=user)
            iam.put_user_policy(UserName=user, PolicyName=POLICY_NAME, PolicyDocument=json.dumps(policy))
            key = iam.create_access_key(UserName=user)["AccessKey"]
            keys[user] = (key["AccessKeyId"], key["SecretAccessKey"])
    except ClientError as e:
        raise RuntimeError(
            f"{endpoint}: setup call refused ({e.response['Error'].get('Code')}): start the server fresh with "
            f"INITIAL_NO_AUTH_ACTION_COUNT={no_auth_action_count(len(users))}"
        ) from e
    try:  # a made-up key must be refused now, or anyone could still act without credentials
        s3.list_objects_v2(Bucket=bucket, MaxKeys=0)
    except ClientError:
        pass
    else:
        raise RuntimeError(f"{endpoint} still accepts unauthenticated requests: INITIAL_NO_AUTH_ACTION_COUNT "
                           f"is not set, or larger than {no_auth_action_count(len(users))}")
    log.info("provisioned %s at %s: bucket %s, users %s", bucket, endpoint, bucket, sorted(keys))
    return keys


def policy_documents(exchange_bucket: str, sites: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Every policy a deployment needs, by file name: what ``insitu iam-policies`` writes for AWS.

    Parameters
    ----------
    exchange_bucket : str
        The exchange's bucket.
    sites : dict of str to str
        Site name to its own bucket.

    Returns
    -------
    dict of str to dict
        ``site-<site>-store.json`` (attach to the site's principal in its own account),
        ``site-<site>-exchange.json`` (the site's principal on the exchange) and
        ``coordinator-exchange.json`` (the coordinator's principal) and ``exchange-bucket.json`` (the exchange
        bucket's own policy: anchors are write-once).
    """
    docs = {"coordinator-exchange.json": exchange_coordinator_policy(exchange_bucket),
            "exchange-bucket.json": exchange_bucket_policy(exchange_bucket)}
    for site, bucket in sites.items():
        docs[f"site-{site}-store.json"] = site_store_policy(bucket)
        docs[f"site-{site}-exchange.json"] = exchange_site_policy(exchange_bucket, site)
    return docs


def render(policy: dict[str, Any]) -> str:
    """A policy as the JSON text AWS accepts (stable: sorted keys, two-space indent, final newline)."""
    return json.dumps(policy, indent=2, sort_keys=True) + "\n"
