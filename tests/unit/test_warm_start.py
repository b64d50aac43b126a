"""What a flow run forked from a worker's fork server is given: the environment a new process would have had (the
worker's, the locked job configuration's, the per-run keys) and the runner with the actor's own flows preloaded."""

from __future__ import annotations

import os
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from deployments import worker_policy as policy
from deployments.warm_start import LAZY_IMPORTS, preload_modules, run_environment


def _run() -> Any:
    return SimpleNamespace(id=uuid.uuid4())


def test_the_run_gets_the_workers_environment_then_the_configured_then_its_own_keys(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INSITU_TEST_WORKER_ONLY", "worker")
    monkeypatch.setenv("INSITU_TEST_BOTH", "worker")
    monkeypatch.setenv("PREFECT__FLOW_RUN_ID", "an-earlier-run")
    run = _run()
    env = run_environment(run, {"INSITU_TEST_BOTH": "configured", "INSITU_TEST_DROPPED": None},
                          {"PREFECT__CONTROL_PORT": "4242"})
    assert env["INSITU_TEST_WORKER_ONLY"] == "worker"
    assert env["INSITU_TEST_BOTH"] == "configured"
    assert "INSITU_TEST_DROPPED" not in env  # None removes a key, as for a new process
    assert env["PREFECT__FLOW_RUN_ID"] == str(run.id)  # this run's, never the worker's or another run's
    assert env["PREFECT__CONTROL_PORT"] == "4242"
    assert env["PREFECT__ENABLE_CANCELLATION_AND_CRASHED_HOOKS"] == "false"
    assert all(isinstance(v, str) for v in env.values())
    assert set(os.environ) <= set(env)


@pytest.mark.parametrize("role", ["site", "coordinator"])
def test_the_fork_server_imports_the_runner_and_only_the_roles_flows(role: str) -> None:
    modules = preload_modules(role)
    assert modules[0] == policy.RUNNER_MODULE
    own = {target.partition(":")[0] for _, target in policy.flows_for(role).values()}
    # the worker's own module (a fork runs it as __mp_main__) and what the flows import lazily
    assert set(modules[1:]) == own | {"deployments.worker", *LAZY_IMPORTS}
    other = "coordinator" if role == "site" else "site"
    assert not own & {target.partition(":")[0] for _, target in policy.flows_for(other).values()}


def test_a_run_whose_fork_server_died_is_waited_for_by_its_pid_and_the_next_run_gets_a_new_server() -> None:
    """multiprocessing reports 255 at once when the fork server's status pipe closes: the run itself may still be
    going, and the starter must not return (the executor would report it Crashed) until its pid is gone."""
    import multiprocessing
    import signal
    import time

    from deployments import warm_start

    ctx = multiprocessing.get_context("forkserver")
    process = ctx.Process(target=time.sleep, args=(3,))
    warm_start._start(process)
    server = multiprocessing.forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
    assert server is not None
    os.kill(server, signal.SIGKILL)  # the server alone: its fork keeps sleeping
    started = time.monotonic()
    code = warm_start._wait(process)
    assert code == warm_start.LOST_STATUS
    assert time.monotonic() - started > 1.5, "returned while the run was still going"
    assert process.pid is not None and not warm_start._alive(process.pid)
    # the worker's next run starts a new fork server (multiprocessing sees the old one dead)
    again = ctx.Process(target=time.sleep, args=(0,))
    warm_start._start(again)
    assert warm_start._wait(again) == 0


@pytest.mark.parametrize(("state", "stopped"), [("Pending", False), ("Running", False), ("Cancelled", True),
                                                ("Completed", True), ("Failed", True), ("Crashed", True)])
def test_a_run_that_ended_before_its_process_started_is_not_run(state: str, stopped: bool,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """Prefect's server lets a Cancelled run go back to Running: a site run the coordinator cancelled while its
    worker held it (Pending) would be brought back by its own engine. The runner looks first (a Cancelling one is
    marked Cancelled: an API call, covered by the e2e test of a stalled prepare)."""
    import logging

    import prefect.states

    from deployments.runner import stopped_before_start

    run = SimpleNamespace(id=uuid.uuid4(), state=getattr(prefect.states, state)(message="left out"))
    assert stopped_before_start(run, logging.getLogger("test")) is stopped  # type: ignore[arg-type]
    assert ("not run" in caplog.text) is stopped
