"""A site's root of trust is not its runtime's: attacked as code running as the site's own OS user.

The site's runtime user (``insitu-eu``) runs its flows, its Dask workers and the user's model code. It used to
own its identity file (admin keys, audit socket) and its installed policy. Now ``insitu-eu-admin`` owns them,
and the CA's private key; the runtime reads what it must and changes none of it. Every attack below runs
as the runtime user (``subprocess(user=, group=)``), as the attacker in issue #18 did, with the site's own
environment. Refusals the kernel makes (a write, a rename, a read) are not seen by the site, so they have no
audit line; those the site makes (a policy it will not install or load) are in its audit log with their rule.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from typing import Any

import pytest
from platform_helpers import job_events, run_flow

from deployments.cli import signing as governance
from deployments.platform import REPO, Platform, PlatformError
from insitu.governance.audit import read_events, verify
from insitu.governance.identity import write_private
from insitu.governance.policy import SitePolicy, sign_policy
from insitu.governance.policy_version import RULE_VERSION

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(os.geteuid() != 0, reason="the admin/runtime separation needs root (CI runs as root)")]

# What the attacker runs as insitu-eu: each step reports "ok" or the exception it met.
ATTACK = r"""
import json, os, subprocess, sys, time
from pathlib import Path
a = json.loads(sys.argv[1])
out = {}
def step(name, fn):
    try:
        out[name] = ["ok", fn()]
    except Exception as e:
        out[name] = [type(e).__name__, str(e)]
ident_path = Path(a["identity"])
def add_admin_key():
    raw = json.loads(ident_path.read_text())
    raw["admins"]["mallory"] = "00" * 32
    ident_path.write_text(json.dumps(raw))
step("read_identity", lambda: json.loads(ident_path.read_text())["actor"])
step("write_identity", add_admin_key)
step("replace_identity", lambda: os.replace(a["own_copy"], ident_path))
step("rename_admin_dir", lambda: os.rename(ident_path.parent, ident_path.parent.with_name("eu-gone")))
step("write_policy", lambda: Path(a["policy"]).write_text(a["permissive"]))
step("write_older_policy", lambda: Path(a["policy"]).write_text(a["older"]))
step("write_record", lambda: Path(a["record"]).write_text('{"version": 0, "sha256": ""}'))
step("read_ca_key", lambda: Path(a["ca_key"]).read_bytes()[:1].hex())
step("ca_key_in_home", lambda: Path(a["home_ca_key"]).exists())
step("read_leaf_key", lambda: len(Path(a["leaf_key"]).read_bytes()) > 0)
# A fake audit service of the runtime's own: its own HMAC key, its own signing key, a socket in its home.
from insitu.governance.audit_proof import new_service_key
from insitu.governance.audit_service import AuditServiceError
from insitu.governance.identity import load_identity
import dataclasses
tmp = Path(a["tmp"])
cfg = tmp / "fake-audit.json"
sock = tmp / "fake-audit.sock"
cfg.write_text(json.dumps({"actor": "eu", "log": str(tmp / "fake.jsonl"), "key": os.urandom(32).hex(),
                           "socket": str(sock), "allowed_uids": [os.getuid()], "signing_key": new_service_key()}))
fake = subprocess.Popen([sys.executable, "-m", "insitu.governance.audit_service", "--config", str(cfg)],
                        stderr=subprocess.DEVNULL)
try:
    deadline = time.monotonic() + 30
    while not sock.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    def point_identity_at_fake():
        raw = json.loads(ident_path.read_text())
        raw["audit_socket"] = str(sock)
        ident_path.write_text(json.dumps(raw))
    step("point_audit_socket", point_identity_at_fake)
    real = load_identity()
    step("real_service", lambda: real.audit().append("probe.runtime", note="the real, pinned service")["seq"])
    faked = dataclasses.replace(real, audit_socket=sock)  # the pinned key stays: it is the admin's
    step("fake_service", lambda: faked.audit().append("data.read", shard="eu-000"))
    step("fake_got", lambda: (tmp / "fake.jsonl").read_text().count("data.read"))
finally:
    fake.terminate()
    fake.wait(10)
print(json.dumps(out))
"""


def _attack(p: Platform, args: dict[str, Any]) -> dict[str, list[Any]]:
    acct = p.account("eu")
    env = {**p.site_env("eu"), "PYTHONPATH": str(REPO)}  # the checkout the site's flows run from
    r = subprocess.run([sys.executable, "-c", ATTACK, json.dumps(args)], env=env, capture_output=True,
                       text=True, timeout=120, user=acct.uid, group=acct.gid, extra_groups=[], cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _permissive(p: Platform, version: int) -> str:
    """``permit (principal, action, resource);`` signed with a key the runtime made itself, named as the admin."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    current = SitePolicy.model_validate(json.loads(p.policy_file("eu").read_text())["policy"])
    lax = current.model_copy(update={"version": version,
                                     "cedar": '@id("anything") permit (principal, action, resource);'})
    return sign_policy(lax, "eu-admin", Ed25519PrivateKey.generate()).model_dump_json()


def _install_refusals(p: Platform) -> list[dict[str, Any]]:
    return [e["fields"] for e in read_events(p.audit_log("eu"))
            if e["event"] == "policy.refused" and e["fields"].get("action") == "install"]


def test_the_runtime_cannot_change_its_root_of_trust(deployed: Platform, signer: Any) -> None:
    p = deployed
    admin, runtime = p.admin_account("eu"), p.account("eu")
    assert admin.name == "insitu-eu-admin" and admin.uid not in (runtime.uid, 0)
    for path, mode in ((p.admin_dir("eu"), 0o750), (p.identity_file("eu"), 0o640), (p.policy_file("eu"), 0o640),
                       (p.policy_record("eu"), 0o640), (p.ca_dir("eu"), 0o700), (p.ca_dir("eu") / "ca-key.pem", 0o600)):
        st = path.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (admin.uid, mode), (path, st.st_uid, oct(st.st_mode))

    # (c) v2 accepted (same rules, a new version), so v1 is now an older, validly signed policy.
    v1 = p.policy_file("eu").read_text()
    governance.apply(p, "eu", "eu-admin", None, None, None)
    v2 = p.policy_file("eu").read_text()
    assert json.loads(v2)["policy"]["version"] == json.loads(v1)["policy"]["version"] + 1
    own_copy = p.actor_home("eu") / "tmp" / "identity.json"
    args = {"identity": str(p.identity_file("eu")), "policy": str(p.policy_file("eu")),
            "record": str(p.policy_record("eu")), "permissive": _permissive(p, 99), "older": v1,
            "ca_key": str(p.ca_dir("eu") / "ca-key.pem"), "home_ca_key": str(p.tls_dir("eu") / "ca-key.pem"),
            "leaf_key": str(p.tls_dir("eu") / "site-key.pem"), "tmp": str(p.actor_home("eu") / "tmp"),
            "own_copy": str(own_copy)}
    identity_before = p.identity_file("eu").read_text()
    write_private(own_copy, identity_before.replace('"admins": {', '"admins": {"mallory": "' + "00" * 32 + '", '),
                  runtime.uid, runtime.gid)
    seen = _attack(p, args)

    # It reads what it must: its identity and its own TLS leaf key.
    assert seen["read_identity"] == ["ok", "eu"] and seen["read_leaf_key"] == ["ok", True]
    # (a) It cannot add an admin key, swap the file for its own, or move the admin's directory away.
    for step in ("write_identity", "replace_identity", "rename_admin_dir"):
        assert seen[step][0] == "PermissionError", (step, seen[step])
    assert p.identity_file("eu").read_text() == identity_before
    # (b, c) It cannot write a permissive policy, an older one, or the record of accepted versions.
    for step in ("write_policy", "write_older_policy", "write_record"):
        assert seen[step][0] == "PermissionError", (step, seen[step])
    assert p.policy_file("eu").read_text() == v2
    # (e) The CA key is the admin's: not readable, and not in the runtime's home.
    assert seen["read_ca_key"][0] == "PermissionError" and seen["ca_key_in_home"] == ["ok", False]
    # (d) It cannot point its identity at its own audit service; a client facing that service fails closed
    # (the service's key is pinned in the admin's identity), while the real service answers.
    assert seen["point_audit_socket"][0] == "PermissionError"
    assert seen["real_service"][0] == "ok"
    assert seen["fake_service"][0] == "AuditServiceError" and "audit.service-verified" in seen["fake_service"][1]
    probe = [e for e in read_events(p.audit_log("eu")) if e["event"] == "probe.runtime"]
    assert probe and probe[-1]["seq"] == seen["real_service"][1]

    # (b) Through the site's own path for policies (the admin's install): a permissive policy signed by a key the
    # runtime made is refused and audited.
    before = len(_install_refusals(p))
    with pytest.raises(PlatformError, match="policy.signed-by-site-admin"):
        p.install_policy("eu", args["permissive"])
    # (c) ... and so is the older, validly signed v1.
    with pytest.raises(PlatformError, match=f"refuses policy v\\d+: it already accepted v\\d+.*{RULE_VERSION}"):
        p.install_policy("eu", v1)
    refused = _install_refusals(p)[before:]
    assert [r["rule"] for r in refused] == ["policy.signed-by-site-admin", RULE_VERSION], refused
    assert p.policy_file("eu").read_text() == v2

    # (c) v1 put back around the install path (an admin's backup restored by hand): the site refuses to load it,
    # refuses the run, and audits why.
    v1_file = p.policy_file("eu")
    write_private(v1_file, v1, admin.uid, runtime.gid, 0o640)
    job_id = f"e2e-rollback-{uuid.uuid4().hex[:6]}"
    try:
        fr = run_flow("site-prepare/eu", {"job_id": job_id, "shards": ["eu-000"], "request": signer(job_id=job_id)},
                      300)
    finally:
        write_private(v1_file, v2, admin.uid, runtime.gid, 0o640)
    assert fr.state.is_failed() and RULE_VERSION in fr.state.message, fr.state.message
    (refusal,) = job_events(p, "eu", job_id, "policy.refused", "policy.decision")
    assert refusal["fields"]["rule"] == RULE_VERSION and "already accepted" in refusal["fields"]["reason"]
    assert not job_events(p, "eu", job_id, "data.read")
    assert verify(p.audit_log("eu"), p.audit_key("eu")).ok
