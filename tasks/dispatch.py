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
from insitu.federated.kinds import ExchangeError
from insitu.federated.paths import ABORT, EVALUATION, PREPARE_STATS, Document, dispatch
from insitu.governance.dispatch import dispatch_record

# What a site's run of a phase publishes last: the phase's result on the exchange.
PUBLISHED = {"site-prepare": PREPARE_STATS, "site-evaluate": EVALUATION}


def start_site_runs(flow_name: str, params: dict[str, dict[str, Any]], pools: dict[str, str],
                    exchange: Exchange | None = None, goes_on: bool = False) -> dict[str, UUID]:
    """``run_deployment("<flow>/<site>")`` for each site without waiting; returns the flow run ids. Each run is
    recorded on ``exchange`` (the job's, as the coordinator) at once: the site waits for that record. ``goes_on``:
    each run then waits, past its phase, for the coordinator to dispatch it the job's next phase.

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
            exchange.put_json(dispatch(phase, site), dispatch_record(site, phase, str(fr.id), p, goes_on))
        logger.info("started %s/%s as flow run %s", flow_name, site, fr.id)
    return ids


def continue_site_runs(phase: str, params: dict[str, dict[str, Any]], runs: dict[str, UUID],
                       exchange: Exchange, goes_on: bool = False) -> dict[str, UUID]:
    """Dispatch ``phase`` to each site's run that is still going (``runs``: a site's run of the job past its
    previous phase), with ``params`` as a run started for the phase would get them: the run admits the phase as
    that run would (:func:`tasks.context.admit_next_phase`). Returns ``runs``."""
    logger = get_run_logger()
    for site, p in params.items():
        exchange.put_json(dispatch(phase, site), dispatch_record(site, phase, str(runs[site]), p, goes_on))
        logger.info("dispatched %s to %s's running flow run %s", phase, site, runs[site])
    return {site: runs[site] for site in params}


def dispatch_phase(flow_name: str, params: dict[str, dict[str, Any]], runs: dict[str, UUID], pools: dict[str, str],
                   exchange: Exchange, goes_on: bool = False) -> dict[str, UUID]:
    """Each site's run of the next phase (``site-<phase>``): its run of the job that is still going (``runs``),
    dispatched the phase (:func:`continue_site_runs`), else a new run of ``flow_name`` (:func:`start_site_runs`)."""
    states = run_states({site: runs[site] for site in params if site in runs})
    going = [site for site, run in states.items() if not (run.state and run.state.is_final())]
    phase = flow_name.removeprefix("site-")
    return {**continue_site_runs(phase, {site: params[site] for site in going}, runs, exchange, goes_on),
            **start_site_runs(flow_name, {s: p for s, p in params.items() if s not in going}, pools, exchange,
                              goes_on)}


@contextmanager
def aborted_on_failure(exchange: Exchange) -> Iterator[None]:
    """The job's abort marker (unless a phase wrote its own, with its reason) when the job fails: a site's run that
    waits to be dispatched its next phase (a prepare run waiting to train, a train run waiting to evaluate) stops
    waiting at once instead of holding its site's worker until it times out."""
    try:
        yield
    except BaseException as e:
        try:
            if not exchange.exists(ABORT):
                exchange.put_abort(f"{type(e).__name__}: {e}")
        except Exception as marker_error:  # the job's own error is what the operator must see
            get_run_logger().warning("could not write the abort marker: %s", marker_error)
        raise


def run_states(ids: dict[str, UUID]) -> dict[str, FlowRun]:
    with get_client(sync_client=True) as client:
        return {site: client.read_flow_run(i) for site, i in ids.items()}


def wait_for_runs(
    ids: dict[str, UUID], timeout: float, poll: float = 1.0,
    on_poll: Callable[[dict[str, FlowRun]], None] | None = None, settled: Callable[[str, FlowRun], bool] | None = None,
) -> dict[str, FlowRun]:
    """Poll until every run is final (or ``settled(site, run)``: done with its phase, going on to the next) or
    ``timeout`` passes; returns the last seen runs."""
    deadline = time.monotonic() + timeout
    while True:
        runs = run_states(ids)
        if on_poll:
            on_poll(runs)
        if all((r.state and r.state.is_final()) or (settled and settled(s, r)) for s, r in runs.items()) \
                or time.monotonic() > deadline:
            return runs
        time.sleep(poll)


def wait_until_published(ids: dict[str, UUID], exchange: Exchange, doc: Document, timeout: float,
                         on_poll: Callable[[dict[str, FlowRun]], None] | None = None
                         ) -> tuple[dict[str, FlowRun], set[str]]:
    """Wait until each run published ``doc`` (its site's: then it waits, still going, for its next phase) or
    ended, or ``timeout`` passes. Returns the last seen runs and the sites whose run published ``doc``."""
    published: set[str] = set()

    def settled(site: str, run: FlowRun) -> bool:
        if site not in published and published_by(exchange, doc, site, run):
            published.add(site)
        return site in published

    runs = wait_for_runs(ids, timeout, on_poll=on_poll, settled=settled)
    # One more look at each run not counted: it published after the last poll, or published and then ended.
    published.update(s for s, r in runs.items() if s not in published and published_by(exchange, doc, s, r))
    return runs, published


def dispatch_phase_and_wait(flow_name: str, params: dict[str, dict[str, Any]], runs: dict[str, UUID],
                            pools: dict[str, str], exchange: Exchange, timeout: float,
                            on_poll: Callable[[dict[str, FlowRun]], None] | None = None) -> dict[str, str]:
    """The job's last phase on each site (:func:`dispatch_phase`), waited for until every run ended; returns the
    sites that failed it, with why (:func:`without_result`)."""
    ids = dispatch_phase(flow_name, params, runs, pools, exchange)
    return without_result(wait_for_runs(ids, timeout, on_poll=on_poll), exchange, PUBLISHED[flow_name])


def without_result(runs: dict[str, FlowRun], exchange: Exchange, doc: Document) -> dict[str, str]:
    """Sites whose run failed a phase: it did not complete, or it completed without publishing ``doc`` (the phase's
    result) since it started. A Completed state alone proves nothing: the Prefect API can set it."""
    out = failed(runs)
    out.update({site: f"its run ended without publishing {doc.name}" for site, run in runs.items()
                if site not in out and not published_by(exchange, doc, site, run)})
    return out


def published_by(exchange: Exchange, doc: Document, site: str, run: FlowRun) -> bool:
    """Whether ``run`` itself published ``doc`` (``site``'s): the document names the run (no clock is compared). A
    re-run of the job by its id finds its earlier run's document there; that one does not count."""
    try:  # one GET per look (it polls every second per site): a missing document is an ExchangeError too
        return exchange.get_json(doc, writer=site).get("flow_run_id") == str(run.id)
    except ExchangeError:  # missing, or refused by the protocol: no result
        return False


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


def explained(e: Exception, ids: dict[str, UUID], phase: str = "training") -> tuple[str, Exception]:
    """Why a phase failed, with why each site whose run ended did so (a site that failed closed, say): the operator
    reads one message, not every site's run. Returns the reason and the error to raise (a quorum error carries the
    sites' reasons; any other error is raised as it is)."""
    from insitu.federated.rounds import QuorumError

    ended = ended_without_completing(ids)
    reason = f"{e}" + "".join(f"; {site}'s {phase} run ended {why}" for site, why in ended.items())
    return reason, QuorumError(reason) if ended and isinstance(e, QuorumError) else e


def cancel_runs(ids: dict[str, UUID], why: str = "left out: missed the phase's deadline") -> list[str]:
    """Stop these runs (a site left out of a phase must not keep its workers busy): each is set Cancelling. The
    server turns a run no worker has picked up (Scheduled, no process) into Cancelled at once, under its row lock,
    so a worker picking it up at that moment cannot start it; a run a worker holds (Pending, Running) is stopped by
    its process: the runner does not run a flow run it finds Cancelling, and a running one gets the worker's
    cancellation (SIGTERM). Never forced straight to Cancelled: Prefect's server lets a Cancelled run go back to
    Running, so a Pending run forced Cancelled would be brought back by its own engine.

    Returns the keys of the runs it cancelled: a run that ended between the last look and now is left alone
    (and is not late)."""
    from prefect.states import Cancelling

    cancelled: list[str] = []
    with get_client(sync_client=True) as client:
        for key, run_id in ids.items():
            state = client.read_flow_run(run_id).state
            if state is not None and state.is_final():
                continue
            cancelled.append(key)
            # forced: the server's minimal policy, whose one rule here cancels a Scheduled run without a process
            client.set_flow_run_state(run_id, Cancelling(message=why), force=True)
    return cancelled


def leave_out_late(ids: dict[str, UUID], runs: dict[str, FlowRun], late: dict[str, str]) -> dict[str, str]:
    """The sites that failed a phase: those whose run did not complete, and the ``late`` ones (site -> why) whose
    run this cancels. A late run that ended since ``runs`` was read is judged by how it ended."""
    cancelled = cancel_runs({site: ids[site] for site in late})
    ended = [site for site in late if site not in cancelled]
    if ended:
        runs = {**runs, **run_states({site: ids[site] for site in ended})}
    return {**failed(runs), **{site: why for site, why in late.items() if site in cancelled}}
