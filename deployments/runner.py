"""The child process of an insitu worker: run one flow run.

What ``python -m prefect.engine`` does, except where the flow comes from: the flow run's *flow name*
picks it from this actor's fixed list (``worker_policy.py``). The deployment's entrypoint, pull steps
and storage, and ``PREFECT__FLOW_ENTRYPOINT``, are never consulted, so whoever edits a deployment
cannot choose the code a site runs.

A worker forks its runs from its fork server (``deployments/warm_start.py``: :func:`run_forked`);
``python -m deployments.runner <flow-run-id>`` runs one in a new process (the worker's ``--cold-start``).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import TYPE_CHECKING, Any
from uuid import UUID

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun


def main() -> None:
    from prefect.engine import engine_logger

    try:
        flow_run_id = UUID(sys.argv[1] if len(sys.argv) > 1 else os.environ["PREFECT__FLOW_RUN_ID"])
    except (KeyError, ValueError):
        engine_logger.error("invalid flow run id; arguments: %s", sys.argv, exc_info=True)
        sys.exit(1)
    run(flow_run_id)


def run_forked(flow_run_id: str, env: dict[str, str | None], cwd: str) -> None:
    """One flow run in a fork of the worker's fork server: the run's environment and working directory first
    (as a new process would have been given them), Prefect's settings read again from that environment, then
    :func:`run`. A fork ends with ``os._exit``: what an interpreter does at its end is done here, in its order
    (threading's shutdown, where Prefect's log and event workers drain and other threads are joined, then the
    ``atexit`` functions: logging's and MLflow's)."""
    from prefect.context import SettingsContext, get_settings_context
    from prefect.settings import Settings

    for key in set(os.environ) - set(env):
        del os.environ[key]
    os.environ.update({k: v for k, v in env.items() if v is not None})
    os.chdir(cwd)
    try:
        with SettingsContext(profile=get_settings_context().profile, settings=Settings()):
            run(UUID(flow_run_id), forked=True)
    finally:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()


FORKED = "started as a fork of its worker's fork server (code imported when the worker started)"


def run(flow_run_id: UUID, forked: bool = False) -> None:
    """Run the flow run ``flow_run_id`` in this process (``forked``: a fork of the worker's fork server)."""
    from prefect._internal.control_listener import configure_from_env
    from prefect.engine import _drive_run_flow_result, handle_engine_signals

    configure_from_env()  # the worker's control channel: graceful cancellation

    with handle_engine_signals(flow_run_id):
        from prefect._internal.metrics import RunMetrics
        from prefect.client.orchestration import get_client
        from prefect.exceptions import UnfinishedRun
        from prefect.flow_engine import flow_run_logger, load_flow_run, run_flow

        from deployments.worker_policy import load_flow
        from insitu.governance.identity import load_identity

        flow_run = load_flow_run(flow_run_id=flow_run_id)
        run_logger = flow_run_logger(flow_run=flow_run)
        if forked:
            run_logger.info("%s: pid %d", FORKED, os.getpid())
        if stopped_before_start(flow_run, run_logger):
            return
        try:
            if flow_run.deployment_id is None:
                raise LookupError("the flow run has no deployment")
            with get_client(sync_client=True) as client:
                name = client.read_flow(flow_run.flow_id).name
            flow = load_flow(load_identity().role, name)
        except Exception:
            run_logger.error("insitu runner refused to load the flow", exc_info=True)
            raise
        with RunMetrics(flow_run, flow):
            try:
                _drive_run_flow_result(flow, run_flow(flow, flow_run=flow_run, error_logger=run_logger))
            except UnfinishedRun:  # its Running refused: set Cancelling after the look above, before the engine's
                if not stopped_before_start(load_flow_run(flow_run_id=flow_run_id), run_logger):  # first proposal
                    raise


def stopped_before_start(flow_run: FlowRun, run_logger: Any) -> bool:
    """Whether ``flow_run`` was cancelled (or otherwise ended) between its worker's pick-up and its engine's first
    state: it is then not run. Prefect's server lets a Cancelled run go back to Running (an ad-hoc re-run does), and
    a Cancelling one whose process ends without running stays Cancelling (nothing else finalises it: the worker's
    cancellation observer only acts on a process it still tracks), so a Cancelling one is marked Cancelled here."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    state = flow_run.state
    if state is None or not (state.is_final() or state.is_cancelling()):
        return False
    run_logger.warning("flow run %s is %s before it started (%s): not run", flow_run.id, state.name,
                       state.message or "no reason given")
    if state.is_cancelling():
        with get_client(sync_client=True) as client:
            # not forced: Cancelling -> Cancelled is the one transition the server allows out of Cancelling
            client.set_flow_run_state(flow_run.id, Cancelled(
                message=f"cancelled before it started: {state.message or 'no reason given'}"))
    return True


if __name__ == "__main__":
    main()
