"""Start site flow runs on their own pools and wait for them, as the coordinator.

Each run the coordinator creates is recorded on the exchange, under the coordinator's own prefix, with its flow
run id and parameters (:mod:`insitu.governance.dispatch`): a site admits only a run dispatched so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound

from insitu.federated.exchange import Exchange
from insitu.federated.paths import dispatch
from insitu.governance.dispatch import dispatch_record


def start_site_runs(flow_name: str, params: dict[str, dict[str, Any]], pools: dict[str, str],
                    exchange: Exchange | None = None) -> dict[str, UUID]:
    """``run_deployment("<flow>/<site>")`` for each site without waiting; returns the flow run ids. Each run is
    recorded on ``exchange`` (the job's, as the coordinator) at once: the site waits for that record.

    Each deployment must still be on the pool ``conf/sites.yaml`` gives its site (``pools``): anyone with
    the API's credential can move a deployment, and a site's work must not be sent to another site.
    """
    if not params:
        return {}
    logger = get_run_logger()
    ids: dict[str, UUID] = {}
    deployments: dict[str, UUID] = {}
    with get_client(sync_client=True) as client:
        for site in params:
            try:
                dep = client.read_deployment_by_name(f"{flow_name}/{site}")
            except ObjectNotFound:  # Prefect says only "ObjectNotFound: None": say what is missing and the fix
                raise LookupError(f"{flow_name}/{site} is not deployed: run insitu deploy") from None
            deployments[site] = dep.id
            if dep.work_pool_name != pools[site]:
                raise PermissionError(f"deployment {flow_name}/{site} is on pool {dep.work_pool_name!r}, not site "
                                      f"{site}'s pool {pools[site]!r}: refusing to send {site}'s work there "
                                      "(re-run `insitu deploy`, and find out who moved it)")
    for site, p in params.items():
        fr: FlowRun = run_deployment(deployments[site], parameters=p, timeout=0, as_subflow=True,
                                     flow_run_name=f"{flow_name}-{site}-{p.get('job_id', '')}")
        ids[site] = fr.id
        if exchange is not None:
            phase = flow_name.removeprefix("site-")
            exchange.put_json(dispatch(phase, site), dispatch_record(site, phase, str(fr.id), p))
        logger.info("started %s/%s as flow run %s", flow_name, site, fr.id)
    return ids


def continue_site_runs(phase: str, params: dict[str, dict[str, Any]], runs: dict[str, UUID],
                       exchange: Exchange) -> dict[str, UUID]:
    """Dispatch ``phase`` to each site's run that is still going (``runs``: a ``site-train`` run past its rounds),
    with ``params`` as a run started for the phase would get them: the run admits the phase as that run would
    (:func:`tasks.site_evaluation.evaluate_when_dispatched`). Returns ``runs``."""
    logger = get_run_logger()
    for site, p in params.items():
        exchange.put_json(dispatch(phase, site), dispatch_record(site, phase, str(runs[site]), p))
        logger.info("dispatched %s to %s's running flow run %s", phase, site, runs[site])
    return {site: runs[site] for site in params}


def dispatch_phase(flow_name: str, params: dict[str, dict[str, Any]], runs: dict[str, UUID], pools: dict[str, str],
                   exchange: Exchange) -> dict[str, UUID]:
    """Each site's run of the next phase (``site-<phase>``): its run of the job that is still going (``runs``),
    dispatched the phase (:func:`continue_site_runs`), else a new run of ``flow_name`` (:func:`start_site_runs`)."""
    states = run_states({site: runs[site] for site in params if site in runs})
    going = [site for site, run in states.items() if not (run.state and run.state.is_final())]
    phase = flow_name.removeprefix("site-")
    return {**continue_site_runs(phase, {site: params[site] for site in going}, runs, exchange),
            **start_site_runs(flow_name, {s: p for s, p in params.items() if s not in going}, pools, exchange)}


@contextmanager
def aborted_on_failure(exchange: Exchange, phase: str) -> Iterator[None]:
    """The job's abort marker when ``phase`` fails: site runs that wait to be dispatched their next phase (a train
    run waiting to evaluate) stop waiting at once instead of holding their site's worker until they time out."""
    try:
        yield
    except Exception as e:
        try:
            exchange.put_abort(f"{phase}: {type(e).__name__}: {e}")
        except Exception as marker_error:  # the job's own error is what the operator must see
            get_run_logger().warning("could not write the abort marker: %s", marker_error)
        raise


def run_states(ids: dict[str, UUID]) -> dict[str, FlowRun]:
    with get_client(sync_client=True) as client:
        return {site: client.read_flow_run(i) for site, i in ids.items()}


def wait_for_runs(
    ids: dict[str, UUID], timeout: float, poll: float = 1.0, on_poll: Callable[[dict[str, FlowRun]], None] | None = None
) -> dict[str, FlowRun]:
    """Poll until every run is final or ``timeout`` passes; returns the last seen runs."""
    deadline = time.monotonic() + timeout
    while True:
        runs = run_states(ids)
        if on_poll:
            on_poll(runs)
        if all(r.state and r.state.is_final() for r in runs.values()) or time.monotonic() > deadline:
            return runs
        time.sleep(poll)


def failed(runs: dict[str, FlowRun]) -> dict[str, str]:
    """Sites whose run did not complete, with the state's message."""
    out = {}
    for site, r in runs.items():
        if not (r.state and r.state.is_completed()):
            name = r.state.name if r.state else "UNKNOWN"
            out[site] = f"{name}: {r.state.message if r.state else ''}".strip()
    return out


def ended_without_completing(ids: dict[str, UUID]) -> dict[str, str]:
    """Sites whose run has ended (failed, crashed, cancelled) rather than completed, with why; asked once. A job
    that fails for want of sites names them with this (an orchestrator that does not answer: nothing to add)."""
    try:
        runs = run_states(ids)
    except Exception:
        return {}
    return failed({s: r for s, r in runs.items() if r.state is not None and r.state.is_final()})


def explained(e: Exception, ids: dict[str, UUID], phase: str = "site-train") -> tuple[str, Exception]:
    """Why a phase failed, with why each site whose run ended did so (a site that failed closed, say): the operator
    reads one message, not every site's run. Returns the reason and the error to raise (a quorum error carries the
    sites' reasons; any other error is raised as it is)."""
    from insitu.federated.rounds import QuorumError

    ended = ended_without_completing(ids)
    reason = f"{e}" + "".join(f"; {site}'s {phase} run ended {why}" for site, why in ended.items())
    return reason, QuorumError(reason) if ended and isinstance(e, QuorumError) else e


def cancel_runs(ids: dict[str, UUID]) -> list[str]:
    """Stop these runs (a site left out of a phase must not keep its workers busy): a run that has not started
    is cancelled at once (no worker would ever act on its Cancelling state), a running one is asked to stop.

    Returns the keys of the runs it cancelled: a run that ended between the last look and now is left alone
    (and is not late)."""
    from prefect.states import Cancelled, Cancelling

    why = "left out: missed the phase's deadline"
    cancelled: list[str] = []
    with get_client(sync_client=True) as client:
        for key, run_id in ids.items():
            state = client.read_flow_run(run_id).state
            if state is not None and state.is_final():
                continue
            cancelled.append(key)
            started = state is not None and (state.is_running() or state.is_paused())
            client.set_flow_run_state(run_id, Cancelling(message=why) if started else Cancelled(message=why),
                                      force=True)
    return cancelled


def leave_out_late(ids: dict[str, UUID], runs: dict[str, FlowRun], late: dict[str, str]) -> dict[str, str]:
    """The sites that failed a phase: those whose run did not complete, and the ``late`` ones (site -> why) whose
    run this cancels. A late run that ended since ``runs`` was read is judged by how it ended."""
    cancelled = cancel_runs({site: ids[site] for site in late})
    ended = [site for site in late if site not in cancelled]
    if ended:
        runs = {**runs, **run_states({site: ids[site] for site in ended})}
    return {**failed(runs), **{site: why for site, why in late.items() if site in cancelled}}
