"""Regions as hosts, on the real platform: ``insitu up --isolated`` puts the control plane and each site on a network
of its own (``deployments.platform.netns``). Attacked at the network level from where a site's processes run (as the
site's OS user, in its namespace, with its own credentials in hand): another site's store, Dask scheduler and audit
service cannot be reached, by address or by port; the control plane and the host cannot reach a site's store either.
The demo job runs across the borders to a registered model, with one site started by ``insitu site up`` from a copy
of only its own files; ``insitu down`` removes every namespace, link and route it made.

Its own platform (in a temporary directory, free ports), driven through the CLI as a user would; root only.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from deployments.platform import REPO, Platform
from deployments.platform.netns import CONTROL, NETNS_DIR, entered
from deployments.platform.site_kit import SITE_DIRS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800),
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")]
REFUSED = {"ECONNREFUSED", "ENETUNREACH", "EHOSTUNREACH", "ECONNRESET", "ETIMEDOUT"}


def insitu(state: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "INSITU_HOME": str(state), "INSITU_CONF": str(REPO / "conf"), "COLUMNS": "200"}
    r = subprocess.run([sys.executable, "-m", "deployments.cli", *args], env=env, cwd=REPO, text=True,
                       capture_output=True, timeout=timeout)
    assert r.returncode == 0, f"insitu {' '.join(args)} ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def iso() -> Iterator[Platform]:
    state = Path(tempfile.mkdtemp(prefix="insitu-iso-"))
    state.chmod(0o711)
    try:
        insitu(state, "up", "--isolated", "--free-ports")
        yield Platform(state)
    finally:
        p = Platform(state)
        plan = p.network
        pids = dict(p.state.get("pids", {}))
        subprocess.run([sys.executable, "-m", "deployments.cli", "down"], cwd=REPO, timeout=300,
                       env={**os.environ, "INSITU_HOME": str(state)}, capture_output=True)
        assert plan is not None
        left = [n for n in plan.namespaces if os.path.exists(f"{NETNS_DIR}/{n}")]
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
        alive = [n for n, pid in pids.items() if os.path.exists(f"/proc/{pid}")]
        shutil.rmtree(state, ignore_errors=True)
        assert not left and f"i{plan.tag}h" not in links and plan.network not in routes, (left, links, routes)
        assert not alive, f"processes left behind after down: {alive}"


def _net_inode(path: str) -> int:
    return os.stat(path).st_ino


PROBE = r"""
import errno, json, socket, sys
targets = json.loads(sys.argv[1])
out = {}
for name, (kind, addr) in targets.items():
    if kind == "unix":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        addr = "\0" + addr[1:]
    else:
        s = socket.socket(); addr = tuple(addr)
    s.settimeout(3)
    try:
        s.connect(addr); out[name] = "connected"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e))
    finally:
        s.close()
if len(sys.argv) > 2:  # with the site's own keys in hand, to another site's store
    import botocore.session
    import os
    c = botocore.session.get_session().create_client(
        "s3", endpoint_url=sys.argv[2], region_name="us-east-1", aws_access_key_id=os.environ[sys.argv[3]],
        aws_secret_access_key=os.environ[sys.argv[4]], config=__import__("botocore.config").config.Config(
            connect_timeout=3, retries={"max_attempts": 1}))
    try:
        c.list_objects_v2(Bucket="insitu-us"); out["s3 with own keys"] = "listed"
    except Exception as e:
        out["s3 with own keys"] = type(e).__name__
print(json.dumps(out))
"""


def _probe(p: Platform, who: str, targets: dict[str, tuple[str, object]], *extra: str,
           as_site: bool = True) -> dict[str, str]:
    """Connect to each target from ``who``'s namespace (a site: as its OS user, with its worker's environment)."""
    assert p.network is not None
    kw: dict[str, object] = {}
    env = dict(os.environ)
    if as_site:
        acct = p.account(who)
        kw = {"user": acct.uid, "group": acct.gid, "extra_groups": []}
        env = {**p.site_env(who), "PYTHONPATH": str(REPO)}
    with entered(p.network.ns(who)):
        r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(targets), *extra], env=env, cwd="/",
                           capture_output=True, text=True, timeout=120, **kw)  # type: ignore[arg-type]
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_each_region_is_its_own_network_and_no_site_reaches_another(iso: Platform) -> None:
    p = iso
    plan = p.network
    assert plan is not None
    ports = p.state["ports"]
    # ---- each process runs in its own region's namespace; the addresses are the recorded private range
    cp = plan.ns(CONTROL)
    expected = {"prefect-server": cp, "mlflow-server": cp, "s3-exchange": cp, "postgres": cp,
                "audit-coordinator": cp, "worker-insitu-coordinator": cp}
    for s in p.sites.names:
        expected.update({f"s3-{s}": plan.ns(s), f"dask-scheduler-{s}": plan.ns(s), f"dask-workers-{s}": plan.ns(s),
                         f"audit-{s}": plan.ns(s), f"worker-insitu-{s}": plan.ns(s)})
    for name, ns in expected.items():
        pid = p.state["pids"][name]
        assert _net_inode(f"/proc/{pid}/ns/net") == _net_inode(f"{NETNS_DIR}/{ns}"), name
    assert plan.network.startswith("10.") and plan.network.endswith(".0.0/16")
    with entered(cp), open("/proc/sys/net/ipv4/ip_forward") as f:
        assert f.read().strip() == "0"  # the control plane never routes between borders

    # ---- from inside eu, as insitu-eu with eu's own keys: every other site is out of reach; its own site and the
    #      control plane are not (so a refusal below is the border's, not a broken probe)
    targets: dict[str, tuple[str, object]] = {
        "own store": ("tcp", ["127.0.0.1", ports["s3-eu"]]),
        "own audit": ("unix", str(p.audit_socket("eu"))),
        "control plane prefect": ("tcp", [plan.control_address("eu"), ports["prefect"]]),
    }
    for other in ("us", "apac"):
        for server in (f"s3-{other}", f"dask-{other}"):
            targets[f"{server} at its address"] = ("tcp", [plan.site_address(other), ports[server]])
            targets[f"{server} on loopback"] = ("tcp", ["127.0.0.1", ports[server]])
        targets[f"audit-{other}"] = ("unix", str(p.audit_socket(other)))
        targets[f"control plane's end of {other}'s border"] = ("tcp", [plan.control_address(other), ports["prefect"]])
    eu = p.sites.site("eu")
    seen = _probe(p, "eu", targets, f"http://{plan.site_address('us')}:{ports['s3-us']}", str(eu.key_env),
                  str(eu.secret_env))
    assert seen.pop("own store") == seen.pop("own audit") == seen.pop("control plane prefect") == "connected", seen
    assert seen.pop("s3 with own keys") == "EndpointConnectionError", seen
    assert all(v in REFUSED for v in seen.values()), seen

    # ---- the control plane (and the host) cannot reach a site's store or Dask either
    site_targets: dict[str, tuple[str, object]] = {}
    for s in p.sites.names:
        for server in (f"s3-{s}", f"dask-{s}"):
            site_targets[f"{server} at its address"] = ("tcp", [plan.site_address(s), ports[server]])
            site_targets[f"{server} on loopback"] = ("tcp", ["127.0.0.1", ports[server]])
        site_targets[f"audit-{s}"] = ("unix", str(p.audit_socket(s)))
    from_cp = _probe(p, CONTROL, site_targets, as_site=False)
    assert all(v in REFUSED for v in from_cp.values()), from_cp
    host = {k: v for k, v in site_targets.items() if "address" in k}
    host["a site's border, control plane end"] = ("tcp", [plan.control_address("us"), ports["prefect"]])
    from_host = {}
    for name, (_, (addr, port)) in host.items():  # type: ignore[misc]
        import socket

        with socket.socket() as s:
            s.settimeout(3)
            from_host[name] = errno.errorcode.get(s.connect_ex((addr, port)), "connected")
    assert all(v in REFUSED for v in from_host.values()), from_host


def test_the_job_crosses_the_borders_with_a_site_started_from_only_its_own_files(iso: Platform) -> None:
    p = iso
    insitu(p.dir, "seed", "--rows", "1500")  # each store from inside its own site
    insitu(p.dir, "deploy")
    # ---- eu's admin: eu stopped here, its files (and only those) copied to "eu's host", started from there
    p.down(site="eu")
    host = Path(tempfile.mkdtemp(prefix="insitu-eu-host-"))
    try:
        host.chmod(0o711)
        subprocess.run(["cp", "-a", "--parents", *(d.format(site="eu") for d in SITE_DIRS), str(host)],
                       cwd=p.dir, check=True)
        held = sorted(str(f.relative_to(host)) for f in host.rglob("*") if f.is_file())
        assert held and all(f.split("/")[1] in ("eu", "eu.json") for f in held), held
        kit = json.loads((host / "sites" / "eu.json").read_text())
        assert set(kit["secrets"]["audit"]) == {"eu"} and set(kit["secrets"]["s3"]["exchange"]) == {"eu"}
        up = insitu(host, "site", "up", "--site", "eu")
        assert "started audit-eu, s3-eu, dask-scheduler-eu, dask-workers-eu, worker-insitu-eu" in up.stdout, up.stdout
        ident = json.loads((host / "admin" / "eu" / "identity.json").read_text())
        assert ident["audit_log"].startswith(str(host)) and ident["policy"].startswith(str(host))

        job = f"e2e-iso-{uuid.uuid4().hex[:6]}"
        run = insitu(p.dir, "run", "--training", "fraud", "--rounds", "1", "--as", "alice", "--job-id", job,
                     timeout=1200)
        assert "registered insitu-fraud version" in run.stdout, run.stdout[-3000:]
        # eu took part from its own host: its reads and its update are in the audit log there
        log = (host / "audit" / "eu" / "eu.jsonl").read_text()
        events = [json.loads(line) for line in log.splitlines() if job in line]
        assert {"data.read", "policy.decision"} <= {e["event"] for e in events}, {e["event"] for e in events}
        insitu(host, "site", "down", "--site", "eu")
    finally:
        shutil.rmtree(host, ignore_errors=True)
    insitu(p.dir, "up")  # eu back from the operator's directory
