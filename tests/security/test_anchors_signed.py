"""Anchors are write-once and checked (issue 18, item 3), attacked as a site's own runtime would.

Code running as eu's runtime OS user, with eu's own exchange credentials (what its flows, Dask workers and the
user's model code hold), tries to spoil eu's anchors: write over one, add one with a huge sequence number, add
one signed with a key of its own. The exchange refuses the overwrite (403, rule ``audit.anchor-write-once``,
recorded in the exchange endpoint's log); ``insitu audit verify`` names the added objects as noise and still
verifies eu's log, and a real rollback is still caught. The local exchange keeps its anchors across
``down``/``up``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
import typer
from platform_helpers import EXCHANGE, run_dispatched

from deployments.cli import audit_verify
from deployments.platform import REPO, Platform
from insitu.governance.anchors import RULE_WRITE_ONCE, anchor_key, list_anchors
from insitu.governance.trail import verify_trail
from insitu.storage import store_from_env

pytestmark = pytest.mark.e2e
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="separate OS users per site need root (CI runs as root)")

ATTACK = r"""
import json, os, sys
import boto3
from botocore.exceptions import ClientError
from insitu.conf import load_sites
from insitu.governance.anchor_signing import new_service_key, private_key, sign_anchor

conf, bucket, steps = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
ref = load_sites(conf + "/sites.yaml").exchange
s3 = boto3.client("s3", endpoint_url=os.environ[ref.endpoint_env], aws_access_key_id=os.environ[ref.key_env],
                  aws_secret_access_key=os.environ[ref.secret_env], region_name="us-east-1")
out = {"uid": os.getuid()}
for name, (op, key, body) in steps.items():
    if body == "forged":  # a well-formed anchor, signed with a key the site made itself
        seq, sha = key.rsplit("/", 1)[1][:-5].split("-")
        body = json.dumps(sign_anchor(private_key(new_service_key()), "eu", int(seq), sha))
    try:
        if op == "put":
            s3.put_object(Bucket=bucket, Key=key, Body=body.encode())
        else:
            s3.copy_object(Bucket=bucket, Key=key, CopySource={"Bucket": bucket, "Key": key},
                           MetadataDirective="REPLACE")
        out[name] = "written"
    except ClientError as e:
        out[name] = [e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"]["Code"],
                     e.response["Error"].get("Message", "")]
print(json.dumps(out))
"""


def _as_eu(p: Platform, steps: dict[str, tuple[str, str, str]]) -> dict[str, Any]:
    """Run the attack as eu's runtime OS user, with eu's worker environment (its own exchange keys)."""
    acct = p.account("eu")
    r = subprocess.run([sys.executable, "-c", ATTACK, str(p.conf_dir), EXCHANGE, json.dumps(steps)],
                       env={**p.site_env("eu"), "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                       timeout=120, user=acct.uid, group=acct.gid, extra_groups=[], cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def _exchange(p: Platform) -> Any:
    return store_from_env(p.sites.exchange, "exchange")


def _trail(p: Platform) -> dict[str, Any]:
    found = list_anchors(_exchange(p), p.audit_service_keys())
    return {r.actor: r for r in verify_trail({a: (p.audit_log(a), p.audit_key(a)) for a in p.actors}, found)}


def _prepare(p: Platform, site: str, signer: Any) -> None:
    job_id = f"e2e-anchor-{uuid.uuid4().hex[:6]}"
    fr = run_dispatched(p, f"site-prepare/{site}", {"job_id": job_id, "request": signer(job_id=job_id)}, 300)
    assert fr.state.is_completed(), fr.state.message


@as_root
def test_a_site_cannot_spoil_its_anchors(deployed: Platform, signer: Any, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    _prepare(deployed, "eu", signer)  # eu's flow anchors its head, as eu's audit service signed it
    ex = _exchange(deployed)
    real = list_anchors(ex, deployed.audit_service_keys(), "eu").anchors[-1]
    real_key = anchor_key("eu", real.seq, real.sha256)
    before = ex.fs.cat_file(ex.path(real_key))
    huge = anchor_key("eu", 999_999_999_999, "f" * 64)
    forged = anchor_key("eu", real.seq + 1000, "e" * 64)
    seen = _as_eu(deployed, {
        "overwrite": ("put", real_key, json.dumps({"actor": "eu", "seq": real.seq, "sha256": "0" * 64})),
        "copy_over": ("copy", real_key, ""),
        "huge_seq": ("put", huge, json.dumps({"actor": "eu", "seq": 999_999_999_999, "sha256": "f" * 64})),
        "bad_signature": ("put", forged, "forged"),
    })
    assert seen["uid"] == deployed.account("eu").uid != 0

    # (a) the exchange refuses to write over an anchor, however asked, and says why; the anchor is unchanged
    for step in ("overwrite", "copy_over"):
        status, code, message = seen[step]
        assert (status, code) == (403, "AccessDenied") and RULE_WRITE_ONCE in message, seen[step]
    assert ex.fs.cat_file(ex.path(real_key)) == before
    assert f"refused to write over {EXCHANGE}/{real_key}" in (deployed.dir / "logs" / "s3-exchange.log").read_text()

    # (b, c) what eu may add under its own prefix is written, but counts for nothing: noise, named, with why
    assert seen["huge_seq"] == seen["bad_signature"] == "written"
    r = _trail(deployed)["eu"]
    noise = {n.key: n.why for n in r.noise}
    assert r.ok and "rolled back" not in r.reason, r.reason
    assert "unsigned" in noise[huge] and "bad signature" in noise[forged], noise
    audit_verify(state_dir=deployed.dir, conf=deployed.conf_dir, actor=[], skip_anchors=False)  # exit 0
    out = capsys.readouterr().out
    assert "noise" in out and huge in out and forged in out

    # (d) a real rollback is still caught, beside the noise
    log = deployed.audit_log("eu")
    files = [log, log.with_name(log.name + ".head")]
    saved = {f: f.read_bytes() for f in files}
    _prepare(deployed, "eu", signer)  # a new signed anchor past the saved copy
    after = {f: f.read_bytes() for f in files}
    for f, data in saved.items():
        f.write_bytes(data)  # the site's host rolls its log and head back together
    try:
        r = _trail(deployed)["eu"]
        assert not r.ok and "rolled back or deleted" in r.reason and "seq" in r.reason, r.reason
        assert "999999999999" not in r.reason  # the real anchor caught it, not the bogus one
        with pytest.raises(typer.Exit):
            audit_verify(state_dir=deployed.dir, conf=deployed.conf_dir, actor=["eu"], skip_anchors=False)
    finally:
        for f, data in after.items():
            f.write_bytes(data)
    assert _trail(deployed)["eu"].ok


@as_root
def test_the_local_exchange_keeps_its_anchors_across_down_and_up(platform: Platform) -> None:
    """The exchange endpoint as ``up`` starts it (its own state dir): stopped by ``down``, started afresh."""
    state = Path(tempfile.mkdtemp(prefix="insitu-anchors-"))
    p = Platform(state, REPO / "conf", free_ports=True)
    comp = p._components._s3_server("exchange")  # the very component `up` starts for the exchange
    try:
        p._layout.prepare_dirs()  # the store's own directory, as `up` makes it
        p._processes.ensure([comp])
        p._provisioning.s3("exchange")
        key = anchor_key("eu", 7, "d" * 64)
        seen = _as_eu_on(p, platform, {"write": ("put", key, '{"kept": true}')})
        assert seen["write"] == "written"
        p.down()
        p._processes.ensure([p._components._s3_server("exchange")])
        assert p._provisioning.s3_restored("exchange")  # the same bucket, users and keys, from its disk
        ex = store_from_env(p.sites.exchange, "exchange", p.coordinator_env())
        ex.fs.invalidate_cache()
        assert ex.fs.cat_file(ex.path(key)) == b'{"kept": true}'
        seen = _as_eu_on(p, platform, {"again": ("put", key, '{"kept": false}')})
        assert seen["again"][:2] == [403, "AccessDenied"]  # still write-once after the restart
    finally:
        p.down()
        shutil.rmtree(state, ignore_errors=True)


def _as_eu_on(p: Platform, host: Platform, steps: dict[str, tuple[str, str, str]]) -> dict[str, Any]:
    """The attack as eu's OS user (``host``'s account) with eu's keys on ``p``'s exchange."""
    acct = host.account("eu")
    env = {**host.site_env("eu"), **p._envs.store("exchange", "eu"), "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", ATTACK, str(p.conf_dir), EXCHANGE, json.dumps(steps)], env=env,
                       capture_output=True, text=True, timeout=120, user=acct.uid, group=acct.gid, extra_groups=[],
                       cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)
