"""Process control: start each component in its own session, wait until healthy, stop exactly what was started.

Every PID started is recorded in the state file with its start time, so a later ``insitu down`` (another
process) stops exactly those processes, and a PID the OS reused for something else is never signalled.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psutil

from deployments.platform.errors import PlatformError
from deployments.platform.paths import REPO, PlatformPaths
from deployments.platform.users import Account

if TYPE_CHECKING:
    from deployments.platform.state import PlatformState

log = logging.getLogger(__name__)


@dataclass
class Component:
    """One process of the platform: how to start it, as whom, and how to tell it is healthy."""

    name: str
    command: list[str]
    env: dict[str, str]
    healthy: Callable[[], bool]
    timeout: float = 90.0
    account: Account | None = None  # run as this OS user (None: as the caller)
    extra: dict[str, Any] = field(default_factory=dict)
    netns: str | None = None  # run in this network namespace (an isolated platform's; None: the caller's)

    def is_healthy(self) -> bool:
        """Its health probe, asked from inside its own namespace (where its loopback servers are)."""
        from deployments.platform.netns import entered

        with entered(self.netns):
            return self.healthy()


def alive(pid: int | None, created: float | None = None) -> bool:
    """Is ``pid`` running, and (when ``created`` is known) still the process we started, not a reuse?"""
    if not pid:
        return False
    try:
        p = psutil.Process(pid)
        if created is not None and abs(p.create_time() - created) > 1.0:
            return False
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# Components whose main process alone is signalled, with this signal: PostgreSQL's postmaster shuts its own
# children down ("fast" shutdown on SIGINT); a signal sent to one of them directly reads to it as a crash.
MAIN_PROCESS_ONLY = {"postgres": signal.SIGINT}


def stop_tier(name: str) -> int:
    """The order components stop in: the Prefect workers first, then the Dask workers, then the servers, and the
    database the servers write to last."""
    if name.startswith("worker-"):
        return 0
    if name.startswith("dask-workers"):
        return 1
    return 3 if name in MAIN_PROCESS_ONLY else 2


class Processes:
    """Starts and stops components, recording their PIDs and start times in the state file."""

    def __init__(self, state: PlatformState, paths: PlatformPaths) -> None:
        self._state = state
        self._paths = paths
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def _pids(self) -> dict[str, int]:
        return self._state.data.get("pids", {})

    def pid(self, name: str) -> int | None:
        """The PID recorded for ``name`` (running or not)."""
        return self._pids.get(name)

    def is_ours(self, name: str) -> bool:
        """Is the process recorded for ``name`` still running (and the one we started)?"""
        return alive(self._pids.get(name), self._state.data.get("started", {}).get(name))

    def leftovers(self, name: str) -> list[psutil.Process]:
        """What is left of a component whose main process is gone: the processes of its session (each component
        gets its own, led by its main process), started after it. A server whose main process crashed can leave its
        worker processes serving on its port, so that a new one cannot bind it (MLflow's uvicorn worker does)."""
        pid, started = self._pids.get(name), self._state.data.get("started", {}).get(name)
        if not pid or self.is_ours(name) or psutil.pid_exists(pid):
            return []  # running, never started, or its PID now someone else's: nothing of ours to find
        left = []
        for p in psutil.process_iter(["pid"]):
            try:
                if os.getsid(p.pid) == pid and (started is None or p.create_time() >= started - 1.0):
                    left.append(p)
            except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
                continue
        return left

    def reap(self, name: str) -> list[int]:
        """Kill what is left of a crashed component (see :meth:`leftovers`); returns the PIDs killed."""
        left = self.leftovers(name)
        for p in left:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(left, timeout=10)
        if left:
            log.warning("%s had crashed; killed what it left running: %s", name, [p.pid for p in left])
        return [p.pid for p in left]

    def ensure(self, comps: list[Component]) -> list[str]:
        """Start those of ``comps`` not running (after killing what a crashed one left), wait until all are healthy;
        returns the names started."""
        started = []
        for c in comps:
            if self.is_ours(c.name):
                continue
            self.reap(c.name)
            self.start(c)
            started.append(c.name)
        self.wait(comps)
        return started

    def start(self, comp: Component) -> None:
        logs = self._paths.logs
        logs.mkdir(parents=True, exist_ok=True)
        out = open(self._paths.log_file(comp.name), "ab")  # noqa: SIM115 (the child owns it)
        as_user: dict[str, Any] = {}
        if comp.account is not None and not comp.account.is_current:
            as_user = {"user": comp.account.uid, "group": comp.account.gid, "extra_groups": []}
        # A new session per component: signals reach it (and only it), and down() can stop its group. Started from
        # inside its namespace, it is born there (with everything it starts).
        from deployments.platform.netns import entered

        with entered(comp.netns):
            proc = subprocess.Popen(comp.command, env=comp.env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=str(REPO), start_new_session=True, **as_user)
        out.close()
        self._record(comp.name, proc)

    def _record(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        self._procs[name] = proc
        self._state.data.setdefault("pids", {})[name] = proc.pid
        try:
            self._state.data.setdefault("started", {})[name] = psutil.Process(proc.pid).create_time()
        except psutil.NoSuchProcess:
            pass
        self._state.save()

    def wait(self, comps: list[Component]) -> None:
        """Until every component is healthy; fails at once if one exits, or after its own timeout."""
        pending = list(comps)
        t0 = time.monotonic()
        while pending:
            for c in list(pending):
                if c.is_healthy():
                    pending.remove(c)
                elif not self.is_ours(c.name):
                    tail = self._paths.log_file(c.name).read_text(errors="replace")[-3000:]
                    raise PlatformError(f"{c.name} exited during startup; its log ends:\n{tail}")
                elif time.monotonic() - t0 > c.timeout:
                    raise PlatformError(
                        f"{c.name} not healthy after {c.timeout:.0f}s; see {self._paths.log_file(c.name)}"
                    )
            if pending:
                time.sleep(0.3)

    def stop(self, names: list[str], timeout: float = 15.0) -> list[str]:
        """Stop the named components that are running, with their children: the Prefect workers first, then the
        Dask workers, then the rest (servers). Each tier is signalled at once and waited for together, so a
        component slow to exit costs its tier ``timeout`` once, not every component after it."""
        tiers: dict[int, list[str]] = {}
        for n in names:
            if n in self._pids:
                tiers.setdefault(stop_tier(n), []).append(n)
        stopped = []
        for tier in sorted(tiers):
            stopped += self._stop_together(tiers[tier], timeout)
        return stopped

    def _stop_together(self, names: list[str], timeout: float) -> list[str]:
        """Signal the named processes and their children at once (SIGTERM; PostgreSQL's postmaster alone, SIGINT);
        SIGKILL what is left after ``timeout``; a crashed one's leftovers are killed."""
        procs: list[psutil.Process] = []
        signals: dict[int, signal.Signals | None] = {}  # None: not signalled
        stopped = []
        for name in sorted(names):
            if not self.is_ours(name):
                self.reap(name)  # a crashed one's leftovers go too
                continue
            try:
                main = psutil.Process(self._pids[name])
                children = main.children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            procs += [main, *children]
            if name in MAIN_PROCESS_ONLY:
                signals[main.pid] = MAIN_PROCESS_ONLY[name]
                signals.update(dict.fromkeys((c.pid for c in children), None))  # its main process stops them
            stopped.append(name)
        for p in procs:
            sig = signals.get(p.pid, signal.SIGTERM)
            try:
                if sig is not None:
                    p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        _, still = psutil.wait_procs(procs, timeout=timeout)
        for p in still:
            log.warning("pid %d still running %.0fs after SIGTERM: killed", p.pid, timeout)
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(still, timeout=5)
        for name in names:
            if name in self._procs:
                self._procs[name].wait(timeout=5)
        return stopped
