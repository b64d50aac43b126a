"""A site's processes can read only their own site's secrets (run as root: each site is its own OS user)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from deployments.platform import COORDINATOR, Platform
from insitu.governance.pki import LEAF_KEY

pytestmark = pytest.mark.e2e

PROBE = r"""
import json, sys
out = {}
for path in json.loads(sys.argv[1]):
    try:
        open(path, "rb").read(1)
        out[path] = "read"
    except PermissionError:
        out[path] = "denied"
    except FileNotFoundError:
        out[path] = "missing"
print(json.dumps(out))
"""


def _probe_as(platform: Platform, actor: str, paths: list[str]) -> dict[str, str]:
    """Try to read each path as ``actor``'s OS user, from that actor's own environment."""
    acct = platform.account(actor)
    env = platform.site_env(actor) if actor != COORDINATOR else platform.coordinator_env()
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(paths)], env=env, capture_output=True, text=True,
                       timeout=60, user=acct.uid, group=acct.gid, extra_groups=[], cwd="/")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.skipif(os.geteuid() != 0, reason="separate OS users per site need root (CI runs as root)")
def test_a_site_reads_its_own_secrets_and_no_one_elses(platform: Platform) -> None:
    assert platform.isolate
    eu, us = platform.account("eu"), platform.account("us")
    assert eu.uid != us.uid != platform.account(COORDINATOR).uid and eu.uid != 0

    # The site's processes really run as its own user.
    worker = psutil.Process(platform.state["pids"]["worker-insitu-eu"])
    assert worker.uids().effective == eu.uid
    dask = psutil.Process(platform.state["pids"]["dask-workers-eu"])
    assert dask.uids().effective == eu.uid

    own = [platform.identity_file("eu"), platform.tls_dir("eu") / LEAF_KEY]
    foreign = [
        platform.state_file,  # every credential: the operator's copy
        platform.identity_file("us"), platform.tls_dir("us") / LEAF_KEY, platform.identity_file(COORDINATOR),
        platform.audit_log("us"),
        # its own audit log and key too: only its audit service (another OS user) writes and signs them
        platform.audit_log("eu"), platform.audit_dir / "eu" / "service.json",
        f"/proc/{platform.state['pids']['worker-insitu-us']}/environ",  # us's keys, in its worker's environment
        f"/proc/{platform.state['pids']['worker-insitu-coordinator']}/environ",
    ]
    seen = _probe_as(platform, "eu", [str(p) for p in own + foreign])
    assert all(seen[str(p)] == "read" for p in own), seen
    assert all(seen[str(p)] == "denied" for p in foreign), seen
    # Other files of the state directory cannot even be listed.
    r = subprocess.run(["ls", str(platform.dir)], capture_output=True, text=True, user=eu.uid, group=eu.gid,
                       extra_groups=[], cwd="/")
    assert r.returncode != 0 and "Permission denied" in r.stderr


def test_no_site_process_is_told_where_the_state_is(platform: Platform) -> None:
    for site in platform.sites.names:
        for env in (platform.site_env(site), platform.dask_env(site)):
            assert not any(str(platform.state_file) in v for v in env.values())
            assert "INSITU_HOME" not in env
            # the only paths under the state dir a site is given are inside its own home and its admin's directory
            under = [v for v in env.values() if str(platform.dir) in v]
            mine = (platform.actor_home(site), platform.admin_dir(site))
            assert all(any(Path(v) == d or d in Path(v).parents for d in mine) for v in under), under
        worker = psutil.Process(platform.state["pids"][f"worker-insitu-{site}"])
        assert "INSITU_HOME" not in worker.environ()


PROBE_AUDIT = r"""
import json, sys
from insitu.governance.audit_service import AuditClient, AuditServiceError
out = {}
for actor, sock in json.loads(sys.argv[1]).items():
    try:
        out[actor] = AuditClient(sock, actor, "-").append("probe.connect", note="from eu's user")["actor"]
    except AuditServiceError as e:
        out[actor] = "refused: " + str(e)
print(json.dumps(out))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="separate OS users per site need root (CI runs as root)")
def test_a_site_can_append_to_its_own_audit_log_only_through_its_service(platform: Platform) -> None:
    from insitu.governance.audit import read_events, verify

    acct = platform.account("eu")
    socks = {a: str(platform.audit_socket(a)) for a in ("eu", "us", COORDINATOR)}
    r = subprocess.run([sys.executable, "-c", PROBE_AUDIT, json.dumps(socks)], env=platform.site_env("eu"),
                       capture_output=True, text=True, timeout=60, user=acct.uid, group=acct.gid, extra_groups=[],
                       cwd="/")
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    assert seen["eu"] == "eu"  # recorded, as eu: the service, not the caller, decides whose log it is
    assert seen["us"].startswith("refused") and f"uid {acct.uid} may not write" in seen["us"]
    assert seen[COORDINATOR].startswith("refused")
    assert read_events(platform.audit_log("eu"))[-1]["event"] == "probe.connect"
    assert not [e for e in read_events(platform.audit_log("us")) if e["event"] == "probe.connect"]
    assert verify(platform.audit_log("eu"), platform.audit_key("eu"), required=True).ok
