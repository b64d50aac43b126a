"""Warm starts: a worker's flow runs are forked from a process that imported their code once.

A flow run's process as a new Python (``python -m deployments.runner``, the worker's ``--cold-start``) imports
Prefect, torch, pandas, mlflow and the flows before it can check its identity and policy: 6-8 CPU-seconds per flow
run, four times per job, on machines where two cores are shared by the whole platform. Instead each worker keeps a
fork server (the standard library's ``multiprocessing`` "forkserver" context) that imports ``deployments.runner`` and
this actor's flows once, when the worker starts; each flow run is a fork of it (tens of milliseconds) that runs
:func:`deployments.runner.run_forked`, exactly the code the command would have run.

What does not change: the fork server is a child of the worker, started with the worker's own environment (its
identity, credentials, settings), and it listens on a socket in a directory only the worker's OS user can enter; the
run's environment is the one :class:`prefect.runner._starter_engine.EngineCommandStarter` builds (the worker's
environment, the locked job configuration's, the per-run keys) and nothing from the API; the flow is still picked
by name from this actor's fixed list. The code a fork runs is the code the worker started with: a checkout
changed under a running worker takes effect when the worker restarts (as for the worker's own code).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import multiprocessing.forkserver
import multiprocessing.process
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.abc
from prefect.runner._process_manager import ProcessHandle
from prefect.settings import get_current_settings
from prefect.utilities.processutils import sanitize_subprocess_env

from deployments import worker_policy as policy

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun
    from prefect.runner._control_channel import ControlChannel

_CONTEXT = multiprocessing.get_context("forkserver")
# Starting a process polls every child's status pipe (multiprocessing's _cleanup): two threads reading one pipe at
# once could each see it readable, and the one that reads nothing records the exit code 255. Starts and exit-code
# reads of this process's runs are serialised by this lock.
_CHILDREN = threading.Lock()
# What the flows import only when first used, so that a CLI command loading a config does not pay for it, while
# every flow run does: scikit-learn's metrics (1.4 s of CPU, more on a busy machine) in each run's evaluation.
LAZY_IMPORTS = ("sklearn.metrics",)
LOST_STATUS = 255  # what multiprocessing reports when the fork server's status pipe closed without a status


def preload_modules(role: str) -> list[str]:
    """What the fork server of a ``role`` worker imports: the runner, the modules of the role's flows, and the
    worker's own module (a fork runs the parent's ``__main__`` module again as ``__mp_main__``: its imports are then
    found done)."""
    flows = sorted({target.partition(":")[0] for _, target in policy.flows_for(role).values()})
    return [policy.RUNNER_MODULE, *flows, "deployments.worker", *LAZY_IMPORTS]


def preload(role: str) -> list[str]:
    """Start this process's fork server now, importing :func:`preload_modules` in it (in the server's own process:
    the worker goes on polling while it imports). Returns the modules."""
    modules = preload_modules(role)
    _CONTEXT.set_forkserver_preload(modules)
    multiprocessing.forkserver.ensure_running()
    return modules


def run_environment(flow_run: FlowRun, configured: dict[str, str | None],
                    per_run: dict[str, str]) -> dict[str, str | None]:
    """The flow run's environment, built as Prefect's engine-command starter builds a child's: this process's
    environment, the job configuration's, the current settings, then the per-run keys."""
    env: dict[str, str | None] = dict(os.environ)
    env.update(configured)
    env.update(get_current_settings().to_environment_variables(exclude_unset=True))
    env.update({"PREFECT__FLOW_RUN_ID": str(flow_run.id), "PREFECT__ENABLE_CANCELLATION_AND_CRASHED_HOOKS": "false",
                **per_run})
    return dict(sanitize_subprocess_env(env))


class ForkServerStarter:
    """A Prefect process starter (the contract of ``EngineCommandStarter``: ``start`` hands the handle over through
    ``task_status`` as soon as the process runs, then returns when it ended) whose process is a fork of the
    worker's fork server running :func:`deployments.runner.run_forked`."""

    def __init__(self, *, cwd: Path, env: dict[str, str | None],
                 control_channel: ControlChannel | None = None) -> None:
        self._cwd, self._env, self._control_channel = cwd, env, control_channel

    async def start(self, flow_run: FlowRun,
                    task_status: anyio.abc.TaskStatus[ProcessHandle] = anyio.TASK_STATUS_IGNORED) -> None:
        from deployments.runner import run_forked

        control: dict[str, str] = {}
        if self._control_channel is not None:
            try:  # graceful cancellation: the child connects back with this port and token
                port, token = self._control_channel.register(flow_run.id)
                control = {"PREFECT__CONTROL_PORT": str(port), "PREFECT__CONTROL_TOKEN": token}
            except RuntimeError:  # the channel could not bind: cancellation falls back to a kill
                pass
        process = _CONTEXT.Process(target=run_forked, name=f"flow-run-{flow_run.id}",
                                   args=(str(flow_run.id), run_environment(flow_run, self._env, control),
                                         str(self._cwd)))
        handed_off = False
        try:
            # Blocks until the fork server has forked (and, on the worker's first run, finished its imports).
            await anyio.to_thread.run_sync(_start, process)
            task_status.started(ProcessHandle(process))
            handed_off = True
            await anyio.to_thread.run_sync(_wait, process, abandon_on_cancel=True)
        except BaseException:
            if control and not handed_off:
                self._control_channel.unregister(flow_run.id)  # type: ignore[union-attr]
            raise


def _start(process: multiprocessing.process.BaseProcess) -> None:
    with _CHILDREN:
        process.start()


def _wait(process: multiprocessing.process.BaseProcess) -> int | None:
    """Wait until ``process`` ended; its exit code. When the fork server died first (``insitu down`` signals a
    worker's whole process tree; an operator or the OOM killer may kill the server alone), multiprocessing reports
    255 at once while the run may still be going: it is then waited for by its pid, so the executor does not
    report a running flow Crashed and drop its cancellation channel."""
    multiprocessing.connection.wait([process.sentinel])
    with _CHILDREN:
        process.join()
        code = process.exitcode
    if code == LOST_STATUS and process.pid is not None:
        while _alive(process.pid):
            time.sleep(0.5)
    return code


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process took the pid: ours is gone
        return False
    return True
