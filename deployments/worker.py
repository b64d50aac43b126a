"""The insitu worker: a Prefect process worker that is its site's boundary (``python -m deployments.worker``).

Anyone who can reach the Prefect API can create flow runs with job variables, edit a pool's base job
template, or register a deployment with their own entrypoint or pull steps on a site's pool. Prefect's
stock process worker would run all of these, with the site's credentials in the environment. This
worker instead

* **vets every flow run** before anything starts: it must come from a deployment on this worker's own
  pool, carry no job variables (the run's or the deployment's), have one of this actor's entrypoints and
  exactly the expected pull steps; otherwise the run is set Failed with the reason and the refusal is
  appended to the actor's own audit log (rule, flow run, deployment);
* **ignores the server's job template and every job variable**: the job configuration is the locked one
  from ``worker_policy.py`` (one command, no extra environment, the checkout as working directory), so a
  deployment edited after the check changes nothing;
* **never loads flow code from the API**: the child runs ``deployments.runner``, which imports the flow
  from this actor's fixed list by name, and crash/cancel hooks are resolved the same way. The child is a fork of
  the worker's fork server, which imported that code once (``deployments/warm_start.py``); ``--cold-start``
  starts each run as a new ``python -m deployments.runner`` instead.

The actor (its pool, role and audit log) comes from the worker's own identity file, not from arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import tempfile
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from prefect.client.schemas.objects import FlowRun, WorkPool
from prefect.exceptions import Abort, ObjectNotFound
from prefect.runner._flow_run_executor import FlowRunExecutionResult, FlowRunExecutorContext
from prefect.runner._starter_engine import EngineCommandStarter
from prefect.states import Failed
from prefect.utilities.engine import propose_state
from prefect.workers.process import ProcessJobConfiguration, ProcessWorker, ProcessWorkerResult

from deployments import worker_policy as policy
from deployments.poll_pace import PollPace
from deployments.pool_events import wake_on_pool_events
from deployments.warm_start import ForkServerStarter, preload
from insitu.governance.identity import Identity, load_identity

log = logging.getLogger("insitu.worker")

RULE_JOB_VARIABLES = "worker.no-job-variables"
RULE_DEPLOYMENT = "worker.deployment-required"
RULE_POOL = "worker.own-pool"
RULE_ENTRYPOINT = "worker.entrypoint-allowed"
RULE_PULL_STEPS = "worker.pull-steps-expected"
RULE_FLOW = "worker.flow-allowed"
RULE_VETTING = "worker.vetting-failed-closed"

# A second worker class of type "process" re-points Prefect's in-process registry of worker types at
# this class and warns; this module is the only worker in its process, so that is what we want.
warnings.filterwarnings("ignore", message=r"Type 'InsituWorker' .* has key 'process'", category=UserWarning)


class Refused(Exception):
    """A flow run this worker will not run: the rule and the reason."""

    def __init__(self, rule: str, reason: str) -> None:
        super().__init__(reason)
        self.rule = rule


class LockedJobConfiguration(ProcessJobConfiguration):
    """Built from the locked template with *no* values: job variables cannot reach the job at all."""

    @classmethod
    async def resolve_for_flow_run(  # type: ignore[override]
        cls, flow_run: FlowRun, *, client: Any, work_pool: WorkPool, worker_name: str, worker_id: Any = None,
        deployment: Any = None,
    ) -> LockedJobConfiguration:
        if not deployment and flow_run.deployment_id:
            deployment = await client.read_deployment(flow_run.deployment_id)
        flow = await client.read_flow(flow_run.flow_id)
        config = await cls.from_template_and_values(base_job_template=policy.locked_base_job_template(), values={},
                                                    client=client)
        config.prepare_for_flow_run(flow_run=flow_run, deployment=deployment, flow=flow, work_pool=work_pool,
                                    worker_name=worker_name, worker_id=worker_id)
        return config


class InsituWorker(ProcessWorker):
    type = "process"  # polls a "process" work pool
    job_configuration = LockedJobConfiguration

    def __init__(self, identity: Identity, warm: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("create_pool_if_not_found", False)
        super().__init__(work_pool_name=identity.work_pool, **kwargs)
        self.identity = identity
        self.warm = warm  # fork each run from the fork server (see deployments/warm_start.py)
        self._locked_template = policy.locked_base_job_template()
        self.pace = PollPace()
        self._pool_events: asyncio.Task[None] | None = None

    async def setup(self) -> None:
        await super().setup()
        self._pool_events = asyncio.create_task(self._wake_on_pool_events())

    async def teardown(self, *exc_info: Any) -> None:
        if self._pool_events is not None:
            self._pool_events.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pool_events
        await super().teardown(*exc_info)

    async def _wake_on_pool_events(self) -> None:
        """A flow-run event of this pool (a run scheduled there) makes the poll active at once (see
        deployments/pool_events.py); the pool's id is known once the worker synced with the API."""
        while self._work_pool is None:
            await asyncio.sleep(1.0)
        await wake_on_pool_events(self._work_pool.id, self.pace.active)

    async def get_and_submit_flow_runs(self) -> list[FlowRun]:
        """Prefect's poll, asked every tick while this pool is busy (a run of it was scheduled, submitted, started
        or ended lately) and once per ``IDLE_POLL_S`` while it idles."""
        if not self.pace.due():
            self._last_polled_time = datetime.now(UTC)  # the loop is alive: Prefect's healthcheck reads this
            return []
        runs = await super().get_and_submit_flow_runs()
        if runs:
            self.pace.active()
        return runs

    def _record_work_pool_snapshot(self, work_pool: WorkPool) -> None:
        if work_pool.base_job_template != self._locked_template:
            self._logger.warning("pool %r's base job template on the server differs from the locked one; "
                                 "ignoring it", work_pool.name)
        super()._record_work_pool_snapshot(work_pool.model_copy(update={"base_job_template": self._locked_template}))

    async def vet(self, flow_run: FlowRun) -> None:
        """Raise :class:`Refused` unless ``flow_run`` is exactly what this actor was deployed to run."""
        # The polled run has no work_pool_name; the read endpoint fills it from the run's work queue.
        fresh = await self.client.read_flow_run(flow_run.id)
        jv = {**(flow_run.job_variables or {}), **(fresh.job_variables or {})}
        if jv:
            raise Refused(RULE_JOB_VARIABLES, f"the flow run carries job variables {sorted(jv)}; this worker runs "
                                              "only its locked job configuration")
        if flow_run.deployment_id is None or fresh.deployment_id != flow_run.deployment_id:
            raise Refused(RULE_DEPLOYMENT, "the flow run has no deployment")
        if fresh.work_pool_name != self._work_pool_name:
            raise Refused(RULE_POOL, f"the flow run is on pool {fresh.work_pool_name!r}, not {self._work_pool_name!r}")
        try:
            dep = await self.client.read_deployment(flow_run.deployment_id)
        except ObjectNotFound:
            raise Refused(RULE_DEPLOYMENT, f"deployment {flow_run.deployment_id} does not exist") from None
        if dep.work_pool_name != self._work_pool_name:
            raise Refused(RULE_POOL, f"deployment {dep.name!r} is on pool {dep.work_pool_name!r}")
        if dep.job_variables:
            raise Refused(RULE_JOB_VARIABLES, f"deployment {dep.name!r} carries job variables "
                                              f"{sorted(dep.job_variables)}")
        allowed = {entry for entry, _ in policy.flows_for(self.identity.role).values()}
        if dep.entrypoint not in allowed:
            raise Refused(RULE_ENTRYPOINT, f"deployment {dep.name!r} has entrypoint {dep.entrypoint!r}; a "
                                           f"{self.identity.role} runs only {sorted(allowed)}")
        if (dep.pull_steps or []) != policy.expected_pull_steps():
            raise Refused(RULE_PULL_STEPS, f"deployment {dep.name!r} has pull steps {dep.pull_steps!r}, not "
                                           f"{policy.expected_pull_steps()!r}")
        flow = await self.client.read_flow(flow_run.flow_id)
        pool = await self.client.read_work_pool(self._work_pool_name)
        if pool.base_job_template != self._locked_template:  # not the run's fault: run it, locked, and say so
            self.get_flow_run_logger(flow_run).warning(
                "pool %r's base job template on the server differs from the locked one; ignoring it", pool.name)
        if dep.flow_id != flow_run.flow_id or policy.flows_for(self.identity.role).get(flow.name, ("",))[0] \
                != dep.entrypoint:
            raise Refused(RULE_FLOW, f"flow {flow.name!r} is not the flow of entrypoint {dep.entrypoint!r}")

    async def _refuse(self, flow_run: FlowRun, rule: str, reason: str) -> None:
        message = f"refused by {self.identity.role} {self.identity.actor!r} (worker {self.name!r}): {reason}; " \
                  f"rule {rule}"
        try:
            self.identity.audit().append("run.refused", flow_run_id=str(flow_run.id), rule=rule,
                                         deployment_id=str(flow_run.deployment_id), flow_run_name=flow_run.name,
                                         reason=message)
        except Exception as e:  # the run is refused either way: an unreachable audit log must not leave it Pending
            message += f" (NOT AUDITED: {type(e).__name__}: {e})"
        self.get_flow_run_logger(flow_run).error(message)
        try:
            await propose_state(self.client, Failed(message=message), flow_run_id=flow_run.id)
        except Abort:
            pass

    async def _submit_run_and_capture_errors(  # type: ignore[override]
        self, flow_run: FlowRun, task_status: anyio.abc.TaskStatus[Any] | None = None
    ) -> Any:
        try:
            await self.vet(flow_run)
        except Exception as exc:  # fail closed: an API error while vetting refuses too
            rule, reason = (exc.rule, str(exc)) if isinstance(exc, Refused) else (RULE_VETTING, repr(exc))
            await self._refuse(flow_run, rule, reason)
            self._release_limit_slot(flow_run.id)
            if task_status is not None:
                task_status.started(exc)  # no process, no infrastructure pid
            return exc
        return await super()._submit_run_and_capture_errors(flow_run, task_status)

    async def run(  # type: ignore[override]
        self, flow_run: FlowRun, configuration: ProcessJobConfiguration,
        task_status: anyio.abc.TaskStatus[int] | None = None,
    ) -> ProcessWorkerResult:
        """``ProcessWorker.run``'s command path, with hooks resolved from the local flow list."""
        if task_status is None:
            task_status = anyio.TASK_STATUS_IGNORED
        if configuration.command != policy.locked_job_configuration()["command"]:
            raise RuntimeError("the job configuration is not the locked one")
        workdir = Path(configuration.working_dir or tempfile.gettempdir()).resolve()
        role = self.identity.role

        async def resolve_flow(fr: FlowRun) -> Any:  # on_crashed / on_cancellation hooks
            return policy.load_flow(role, (await self.client.read_flow(fr.flow_id)).name)

        execution: FlowRunExecutionResult | None = None
        self.pace.active()
        try:
            execution = await self._execute(flow_run, configuration, workdir, resolve_flow, task_status)
        finally:
            self.pace.active()
        if execution is None or execution.status_code is None:
            raise RuntimeError("failed to start the flow run's process")
        return ProcessWorkerResult(status_code=execution.status_code, identifier=str(execution.handle.pid))

    async def _execute(self, flow_run: FlowRun, configuration: ProcessJobConfiguration, workdir: Path,
                       resolve_flow: Any, task_status: anyio.abc.TaskStatus[int]) -> FlowRunExecutionResult | None:
        """Start the flow run's process with the locked command and wait for it to end."""
        execution: FlowRunExecutionResult | None = None
        async with FlowRunExecutorContext() as ctx:
            starter: ForkServerStarter | EngineCommandStarter = \
                ForkServerStarter(cwd=workdir, env=configuration.env, control_channel=ctx.control_channel) \
                if self.warm else \
                EngineCommandStarter(command=configuration.command, cwd=workdir, env=configuration.env,
                                     stream_output=configuration.stream_output, control_channel=ctx.control_channel)
            executor = ctx.create_executor(flow_run, starter, resolve_flow=resolve_flow, propose_submitting=False)

            async def execute(*, task_status: anyio.abc.TaskStatus[Any] = anyio.TASK_STATUS_IGNORED) -> None:
                nonlocal execution
                execution = await executor.submit(task_status=task_status)

            async with anyio.create_task_group() as tg:
                handle = await tg.start(execute)
                if handle.pid is None:
                    raise RuntimeError("the flow run's process has no PID")
                task_status.started(handle.pid)
        return execution

    async def _submit_adhoc_run(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("ad-hoc submission is disabled on insitu workers")


def main(argv: list[str] | None = None) -> None:
    from prefect.settings import PREFECT_WORKER_HEARTBEAT_SECONDS, PREFECT_WORKER_PREFETCH_SECONDS
    from prefect.utilities.processutils import setup_signal_handlers_worker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ap = argparse.ArgumentParser(prog="python -m deployments.worker")
    ap.add_argument("--pool", required=True, help="must equal the pool in this actor's identity file")
    ap.add_argument("--name")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--cold-start", action="store_true",
                    help="start each flow run as a new Python process instead of forking it from the fork server")
    args = ap.parse_args(argv)
    identity = load_identity()
    if args.pool != identity.work_pool:
        raise SystemExit(f"--pool {args.pool!r} is not this actor's pool {identity.work_pool!r} "
                         f"(from {identity.path})")
    # As `prefect worker start`: the first SIGTERM/SIGINT stops the worker cleanly, a second kills it.
    setup_signal_handlers_worker(os.getpid(), "the insitu worker", log.info)
    if not args.cold_start:  # the fork server imports the runner and the flows while the worker starts polling
        log.info("fork server for flow runs started, importing %s", ", ".join(preload(identity.role)))
    worker = InsituWorker(identity, warm=not args.cold_start, name=args.name, limit=args.limit,
                          prefetch_seconds=PREFECT_WORKER_PREFETCH_SECONDS.value(),
                          heartbeat_interval_seconds=int(PREFECT_WORKER_HEARTBEAT_SECONDS.value()))
    log.info("insitu worker %s for %s %r on pool %s", worker.name, identity.role, identity.actor, identity.work_pool)
    try:
        asyncio.run(worker.start())
    except (KeyboardInterrupt, asyncio.CancelledError):
        log.info("worker %r stopped", worker.name)


if __name__ == "__main__":
    main()
