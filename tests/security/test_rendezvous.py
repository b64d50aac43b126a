"""A local user with no credentials attacks a site's in-site rendezvous while its ranks train.

The attack of issue #18: find the site's listening TCP ports in the world-readable ``/proc/net/tcp`` (each line
names the socket's owner uid), connect to each as a ``torch.distributed`` TCPStore client, write a key and read
it back. Here the real Dask launcher of ``insitu.parallel`` runs a real gloo process group as one OS user (the
site's runtime user, a fresh one), and another fresh OS user attacks it while the group is alive. The attack
must fail on every port of the site's user, and the store, a file in the launcher's private folder, must be out
of the attacker's reach. A control runs the same attack on a plain TCPStore and must succeed (the attacker's code
works). A full platform job is not started for this: the launcher is the same code a site's ``site-train`` runs
(``insitu.parallel.site.train_site`` → ``launch_on_dask``), and the test stays within a few seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from deployments.platform import REPO
from deployments.platform.users import Account, ensure_account, ensure_code_runnable_by_others

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the site and the attacker are OS users")

SITE = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from distributed import LocalCluster
    from insitu.parallel.launch import launch_on_dask

    status = Path(sys.argv[1])

    def train(rank, world, payload):
        import torch, torch.distributed as dist
        t = torch.tensor([rank + 1.0]); dist.all_reduce(t)
        (status / f"rank{rank}.json").write_text(json.dumps({"pid": os.getpid(), "sum": float(t)}))
        deadline = time.time() + 120
        while not (status / "release").exists() and time.time() < deadline:  # training goes on while attacked
            time.sleep(0.1)
        dist.all_reduce(t)  # the group still works after the attack
        return float(t)

    if __name__ == "__main__":
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                          host="127.0.0.1") as c:
            print(json.dumps(launch_on_dask(c.scheduler_address, train, 2, None, timeout_s=120)))
""")

ATTACKER = textwrap.dedent("""
    import json, sys, os, threading
    from datetime import timedelta
    import torch.distributed as dist

    victim_uid, extra_ports, rdzv_base = int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
    ports = set(extra_ports)
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and int(f[7]) == victim_uid:  # LISTEN, owned by the site's user
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    report = {"ports": sorted(ports), "wrote": [], "errors": {}, "store_files": {}}
    def attempt(port):
        try:
            s = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=2))
            s.set("eve", "was-here")
            if s.get("eve") == b"was-here":
                report["wrote"].append(port)
        except Exception as e:
            report["errors"][port] = type(e).__name__

    for port in sorted(ports):  # a socket that accepts and then says nothing would hang the client: a thread each
        t = threading.Thread(target=attempt, args=(port,), daemon=True)
        t.start()
        t.join(4)
        if t.is_alive():
            report["errors"][port] = "no answer"
    for d in sorted(os.listdir(rdzv_base)):
        path = os.path.join(rdzv_base, d)
        for what, attempt in (("list", lambda: os.listdir(path)),
                              ("read", lambda: open(os.path.join(path, "store"), "rb").read()),
                              ("filestore", lambda: dist.FileStore(os.path.join(path, "store"), 2).set("eve", "x"))):
            try:
                attempt()
                report["store_files"][f"{d}:{what}"] = "ok"
            except Exception as e:
                report["store_files"][f"{d}:{what}"] = type(e).__name__
    print(json.dumps(report), flush=True)
    os._exit(0)  # threads stuck on a silent socket must not keep the process alive
""")


def _as(account: Account, args: list[str], home: Path, timeout: float, **kw: Any) -> Any:
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "TMPDIR": str(home), "PYTHONPATH": str(REPO),
           "DASK_TEMPORARY_DIRECTORY": str(home), "OMP_NUM_THREADS": "1", **kw.pop("env", {})}
    if kw.pop("background", False):
        return subprocess.Popen([sys.executable, *args], user=account.uid, group=account.gid, env=env, cwd=home,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run([sys.executable, *args], user=account.uid, group=account.gid, env=env, cwd=home,
                          capture_output=True, text=True, timeout=timeout)


def _home(root: Path, account: Account, name: str, mode: int = 0o700) -> Path:
    d = root / name
    d.mkdir()
    os.chown(d, account.uid, account.gid)
    d.chmod(mode)
    return d


def test_another_local_user_cannot_reach_a_training_sites_store() -> None:
    site, eve = ensure_account("insitu-t-rdzv-site"), ensure_account("insitu-t-rdzv-eve")
    ensure_code_runnable_by_others(REPO)
    root = Path(tempfile.mkdtemp(prefix="insitu-rdzv-test-"))
    root.chmod(0o755)
    try:
        site_home, eve_home = _home(root, site, "site"), _home(root, eve, "eve")
        # The attacker may list the base folder (the worst case: it knows where the rendezvous lies).
        base = _home(root, site, "rdzv", 0o755)
        status = _home(root, site, "status", 0o755)
        (site_home / "site.py").write_text(SITE)
        (eve_home / "attack.py").write_text(ATTACKER)
        proc = _as(site, ["site.py", str(status)], site_home, 0, background=True,
                   env={"INSITU_RENDEZVOUS_DIR": str(base)})
        try:
            deadline = time.monotonic() + 120
            while not all((status / f"rank{r}.json").exists() for r in (0, 1)):
                assert proc.poll() is None, f"the site's launcher died: {proc.communicate()}"
                assert time.monotonic() < deadline, "the site's ranks never met"
                time.sleep(0.2)
            assert [p.name for p in base.iterdir() if p.name.startswith("insitu-rdzv-")], "no private rendezvous"

            attack = _as(eve, ["attack.py", str(site.uid), "[]", str(base)], eve_home, 120)
            assert attack.returncode == 0, attack.stderr[-2000:]
            report = json.loads(attack.stdout.strip().splitlines()[-1])

            assert report["wrote"] == [], f"the attacker wrote into a site's store on ports {report['wrote']}"
            assert len(report["ports"]) > 1, "the attacker found none of the site's listening ports"
            # The store is a file in a 0700 folder: nothing listed, read, or joined.
            assert report["store_files"] and set(report["store_files"].values()) <= {"PermissionError",
                                                                                    "DistStoreError", "RuntimeError"}, \
                report["store_files"]
        finally:
            (status / "release").touch()
            out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1]) == [6.0, 6.0]  # training went on, undisturbed
        assert not [p for p in base.iterdir() if p.name.startswith("insitu-rdzv-")], "rendezvous left behind"
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


def test_the_control_attack_works_on_a_plain_tcp_store() -> None:
    """Proves the attack above can fail the test: on the old rendezvous (a TCPStore) the same code writes."""
    eve = ensure_account("insitu-t-rdzv-eve")
    ensure_code_runnable_by_others(REPO)
    import torch.distributed as dist

    root = Path(tempfile.mkdtemp(prefix="insitu-rdzv-test-"))
    root.chmod(0o755)
    try:
        eve_home, empty = _home(root, eve, "eve"), _home(root, eve, "empty")
        (eve_home / "attack.py").write_text(ATTACKER)
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10))
        attack = _as(eve, ["attack.py", str(os.geteuid()), json.dumps([store.port]), str(empty)], eve_home, 120)
        assert attack.returncode == 0, attack.stderr[-2000:]
        report = json.loads(attack.stdout.strip().splitlines()[-1])
        assert store.port in report["wrote"] and store.get("eve") == b"was-here"
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)
