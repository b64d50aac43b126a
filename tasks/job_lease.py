"""One run of a job at a time: a second ``retrain`` run of a job id that is running is refused at once, naming the
running one (rule ``job.one-run-at-a-time``), and audited.

The hold is a Prefect global concurrency limit of one slot per job id (``insitu-job-<job id>``, created on the
job's first run and kept for its re-runs), taken with a lease the holder renews while it runs: taking it is one
atomic step on the server, so two runs started together cannot both pass (no check-then-act). A holder that
crashed stops renewing, and its hold lapses ``LEASE_S`` after its last renewal: a re-run whose earlier run is over
waits for that. A slot that stays taken past it with no run of the job active (the server lost the lease) is given
back, audited as ``job.hold-reset``. The platform's Prefect server keeps leases on disk, so a restart loses none.
A renewal that fails (the Prefect server restarting) does not stop the job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
from prefect.client.schemas.filters import (
    FlowFilter,
    FlowFilterName,
    FlowRunFilter,
    FlowRunFilterName,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import ConcurrencyLeaseHolder, FlowRun, StateType
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

from insitu.governance.audit_service import Auditor
from insitu.governance.request import ACTIONS
from tasks.dispatch import cancel_runs

log = logging.getLogger(__name__)

RULE = "job.one-run-at-a-time"
LEASE_S = 60.0  # a crashed holder's lease lapses this long after its last renewal
ACQUIRE_S = 2.0  # how long a run tries before it asks who holds its job
ACTIVE = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.PAUSED, StateType.CANCELLING]


class JobAlreadyRunning(PermissionError):
    """Another run of this job id is running (a decision, not a fault: not retried)."""


def limit_name(job_id: str) -> str:
    return f"insitu-job-{job_id}"


def _ensure_limit(name: str, audit: Auditor, job_id: str, flow_run_id: str | None) -> None:
    """The job's one-slot limit, made by its first run (two runs making it at once: one makes it, both use it).
    One that was changed (more slots, inactive: it would hold nothing) is put back, audited."""
    with get_client(sync_client=True) as c:
        try:
            found = c.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            try:
                c.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
            except ObjectAlreadyExists:
                pass
            return
        if found.limit != 1 or not found.active:
            c.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=1, active=True))
            audit.append("job.hold-repaired", job_id=job_id, flow_run_id=flow_run_id, limit=name,
                         was={"limit": found.limit, "active": found.active})


def active_runs(job_id: str, but: str | None) -> list[FlowRun]:
    """The job's other ``retrain`` runs that are not over (the form's job id, or the one ``insitu run`` gave)."""
    with get_client(sync_client=True) as c:
        runs = c.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["retrain"])),
                                flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
                                    type=FlowRunFilterStateType(any_=ACTIVE))), limit=200)
    return [r for r in runs if str(r.id) != but and ((r.parameters or {}).get("params") or {}).get("job_id") == job_id]


@contextmanager
def one_run_per_job(job_id: str, flow_run_id: str | None, audit: Auditor) -> Iterator[None]:
    """Hold ``job_id`` for the body; refuse (audited) if another run of it is running."""
    name = limit_name(job_id)
    _ensure_limit(name, audit, job_id, flow_run_id)
    holder = ConcurrencyLeaseHolder(type="flow_run", id=UUID(flow_run_id)) if flow_run_id else None

    def hold(timeout_s: float) -> object:
        # strict: a missing limit is an error, not a pass; a failed renewal (the server restarting) is not fatal
        return concurrency(name, occupy=1, timeout_seconds=timeout_s, lease_duration=LEASE_S, strict=True,
                           holder=holder, raise_on_lease_renewal_failure=False)

    with ExitStack() as stack:
        try:
            stack.enter_context(hold(ACQUIRE_S))  # type: ignore[arg-type]
        except TimeoutError:
            others = active_runs(job_id, flow_run_id)
            if others:
                _refuse(job_id, flow_run_id, audit, others)
            # Held by a run that is over: it crashed without letting go. Its lease lapses (and the server gives the
            # slot back) within LEASE_S of its last renewal; wait for that.
            log.warning("job %s is still held by a run that ended without letting go; waiting up to %.0fs for its "
                        "hold to lapse", job_id, LEASE_S)
            try:
                stack.enter_context(hold(LEASE_S + 30))  # type: ignore[arg-type]
            except TimeoutError:
                if active_runs(job_id, flow_run_id):
                    _refuse(job_id, flow_run_id, audit, active_runs(job_id, flow_run_id))
                # No lease left to lapse (the server lost it): give the slot back ourselves, audited. Two runs doing
                # this at once each see the other as active just above, and are refused.
                with get_client(sync_client=True) as c:
                    c.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(active_slots=0))
                audit.append("job.hold-reset", job_id=job_id, flow_run_id=flow_run_id, limit=name,
                             reason="the run that held the job is over and its hold never lapsed")
                try:
                    stack.enter_context(hold(ACQUIRE_S))  # type: ignore[arg-type]
                except TimeoutError:
                    _refuse(job_id, flow_run_id, audit, active_runs(job_id, flow_run_id))
        yield


def _refuse(job_id: str, flow_run_id: str | None, audit: Auditor, others: list[FlowRun]) -> None:
    named = ", ".join(f"flow run {r.id} ({r.name}, {r.state.type.value if r.state else 'unknown'})" for r in others)
    why = (f"job {job_id} is already running as {named or 'another run'}: one run of a job at a time (rule {RULE}). "
           f"Wait for it to end, or cancel it, then re-run with --job-id {job_id} to resume")
    audit.append("job.refused", job_id=job_id, flow_run_id=flow_run_id, rule=RULE, reason=why,
                 running=[str(r.id) for r in others])
    raise JobAlreadyRunning(why)


SITE_FLOWS = [f"site-{action}" for action in ACTIONS]  # a site's flow per action a request may grant
STOP_WAIT_S = 90.0  # a running site run stops when its worker's cancellation observer acts on Cancelling; one
# whose site's worker is down stays Cancelling until the worker is back


def stop_earlier_site_runs(job_id: str, flow_run_id: str | None, audit: Auditor) -> list[str]:
    """Cancel the job's site runs that an earlier run of it left going, and wait for them to end.

    A run of the job that died without ending (its worker's host lost, its process killed) leaves its site runs
    waiting for a global model that will never come; the re-run, holding the job, starts its own. Left going, an
    old one would take the site's workers and publish beside the new one. Called with the job held, so no other
    run of the job is live: every site run of the job still active is a leftover. Audited as
    ``job.earlier-site-runs-cancelled``; returns the cancelled runs' ids.
    """
    with get_client(sync_client=True) as c:
        # the server narrows by name (a site run is named <flow>-<site>-<job id>); the parameter decides
        runs = c.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=SITE_FLOWS)),
                                flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=job_id),
                                                              state=FlowRunFilterState(
                                                                  type=FlowRunFilterStateType(any_=ACTIVE))))
        left = [r for r in runs if (r.parameters or {}).get("job_id") == job_id]
        why = f"left by an earlier run of job {job_id} that ended without ending them; the re-run starts its own"
        cancel_runs({str(r.id): r.id for r in left}, why)
        if left:
            audit.append("job.earlier-site-runs-cancelled", job_id=job_id, flow_run_id=flow_run_id,
                         runs=[f"{r.name} ({r.id})" for r in left])
            log.warning("job %s: cancelled %d site runs an earlier run left going: %s", job_id, len(left),
                        ", ".join(r.name for r in left))
        cancelled = [str(r.id) for r in left]
        deadline = time.monotonic() + STOP_WAIT_S
        while left and time.monotonic() < deadline:
            time.sleep(1)
            left = [r for r in left if not (c.read_flow_run(r.id).state or r.state).is_final()]
        if left:  # its site's worker is down: the run cannot act before the worker is back, and then it stops
            log.warning("job %s: %s still stopping after %.0f s; going on", job_id, ", ".join(r.name for r in left),
                        STOP_WAIT_S)
    return cancelled
