"""An isolated platform's namespaces, links and route are removed by ``insitu down`` read from the state file alone,
also when whatever made them crashed before stopping anything; and going back to one network clears what a crashed
isolated platform left (no servers are started here: only the network, and a process inside it). Root only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from deployments.platform import REPO, Platform
from deployments.platform.netns import NETNS_DIR, entered

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")]


def _host_has(plan_tag: str, network: str) -> bool:
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
    return f"i{plan_tag}h" in links or network in routes


def _crashed_platform(state: Path, conf_dir: Path) -> tuple[Platform, int]:
    """A platform that made its network and started a process in eu's namespace, then died without `down`."""
    p = Platform(state, conf_dir, free_ports=True, isolated=True)
    assert p.network is not None
    p._state.save()
    p.network.create()
    with entered(p.network.ns("eu")):
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    p.state.setdefault("pids", {})["s3-eu"] = proc.pid
    p.state.setdefault("started", {})["s3-eu"] = psutil.Process(proc.pid).create_time()
    p._state.save()
    return p, proc.pid


def test_down_after_a_crash_removes_what_the_state_file_records(tmp_path: Path) -> None:
    conf = REPO / "conf"
    p, pid = _crashed_platform(tmp_path / "a", conf)
    plan = p.network
    assert plan is not None and all(os.path.exists(f"{NETNS_DIR}/{n}") for n in plan.namespaces)
    assert _host_has(plan.tag, plan.network)
    del p  # the process that made it is gone; a new one reads the state file
    r = subprocess.run([sys.executable, "-m", "deployments.cli", "down"], cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "INSITU_HOME": str(tmp_path / "a"), "INSITU_CONF": str(conf)}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "netns " + plan.ns("eu") in r.stdout.replace("\n", "")
    assert not [n for n in plan.namespaces if os.path.exists(f"{NETNS_DIR}/{n}")]
    assert not _host_has(plan.tag, plan.network)
    time.sleep(0.2)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_one_network_again_clears_a_crashed_isolated_platform(tmp_path: Path) -> None:
    conf = REPO / "conf"
    p, pid = _crashed_platform(tmp_path / "b", conf)
    plan = p.network
    assert plan is not None
    os.kill(pid, signal.SIGKILL)  # everything of it died; its namespaces stay behind
    time.sleep(0.2)
    q = Platform(tmp_path / "b", conf, isolated=False)
    assert q.network is None and "isolated" not in q.state
    assert not [n for n in plan.namespaces if os.path.exists(f"{NETNS_DIR}/{n}")]
    assert not _host_has(plan.tag, plan.network)
