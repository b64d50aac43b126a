"""Process control of the local platform, with ``sleep`` standing in for its components (no platform started)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest

from deployments.platform.errors import PlatformError
from deployments.platform.paths import PlatformPaths
from deployments.platform.processes import Component, Processes, stop_tier
from deployments.platform.state import PlatformState

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def _processes(tmp_path: Path) -> tuple[Processes, PlatformState]:
    paths = PlatformPaths(tmp_path)
    state = PlatformState(paths.state_file, {"format": 2})
    return Processes(state, paths), state


def _sleeper(name: str, healthy: bool = True, timeout: float = 5) -> Component:
    return Component(name, ["sleep", "60"], ENV, lambda: healthy, timeout=timeout)


def test_components_start_in_their_own_session_and_are_stopped_workers_first(tmp_path: Path) -> None:
    procs, state = _processes(tmp_path)
    names = ["s3-x", "worker-b", "dask-workers-a", "worker-a", "prefect-server"]
    try:
        assert procs.ensure([_sleeper(n) for n in names]) == names
        assert procs.ensure([_sleeper(n) for n in names]) == []  # running: reused, not started again
        pids = dict(state.data["pids"])
        assert all(os.getsid(pid) == pid for pid in pids.values())  # setsid: signals reach only it
        assert json.loads(state.path.read_text())["pids"] == pids  # saved as recorded, for a later `down`
    finally:
        stopped = procs.stop(list(state.data["pids"]), timeout=5)
    assert stopped == ["worker-a", "worker-b", "dask-workers-a", "prefect-server", "s3-x"]
    assert not [p for p in pids.values() if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def test_stop_tiers() -> None:
    assert [stop_tier(n) for n in ("worker-insitu-eu", "dask-workers-eu", "dask-scheduler-eu", "mlflow-server")] \
        == [0, 1, 2, 2]


def test_a_component_that_exits_fails_with_its_log(tmp_path: Path) -> None:
    procs, _ = _processes(tmp_path)
    dies = Component("dies", ["sh", "-c", "echo boom; exit 3"], ENV, lambda: False, timeout=5)
    with pytest.raises(PlatformError, match="dies exited during startup(.|\n)*boom"):
        procs.ensure([dies])


def test_a_component_never_healthy_fails_after_its_timeout(tmp_path: Path) -> None:
    procs, state = _processes(tmp_path)
    try:
        with pytest.raises(PlatformError, match="slow not healthy after 1s"):
            procs.ensure([_sleeper("slow", healthy=False, timeout=1)])
    finally:
        procs.stop(["slow"], timeout=5)


def test_what_a_crashed_component_left_running_is_killed_before_it_starts_again(tmp_path: Path) -> None:
    import signal

    procs, state = _processes(tmp_path)
    # a server whose worker process outlives it (as MLflow's uvicorn worker does when its main process is killed)
    server = Component("mlflow-server", ["sh", "-c", "sleep 60 & wait"], ENV, lambda: True, timeout=5)
    try:
        procs.ensure([server])
        main = psutil.Process(state.data["pids"]["mlflow-server"])
        deadline = time.monotonic() + 10  # the health check passes at once; sh forks its child a moment later
        while not main.children() and time.monotonic() < deadline:
            time.sleep(0.05)
        (worker,) = main.children()
        main.send_signal(signal.SIGKILL)
        main.wait(5)
        assert worker.is_running() and procs.leftovers("mlflow-server") == [worker]
        assert procs.ensure([server]) == ["mlflow-server"]
        assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
        assert procs.is_ours("mlflow-server")
    finally:
        procs.stop(list(state.data["pids"]), timeout=5)
