"""The coordinator's side of an async job (``federation.mode: async``): the parameter server as Prefect tasks.

Every decision on an arriving update is one task run (``async-update-<site>-<seq>``), so the UI shows the
job's updates one by one; what is decided is :mod:`insitu.federated.asynchronous`'s. A refusal is written to the
coordinator's audit log before the site can see its notice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from insitu.conf import TrainingConfig
from insitu.federated.asynchronous import build_algorithm, update_limit
from insitu.federated.asynchronous.server import Arrival, ParameterServer
from insitu.federated.codecs import UpdateEncoding
from insitu.federated.coordinator import RoundsOutcome
from insitu.federated.exchange import Exchange
from insitu.federated.kinds import MAX_UPDATE_NORM
from insitu.federated.paths import validation
from insitu.federated.rounds import collect
from insitu.federated.validation import RoundValidation, Selection
from insitu.governance.audit_service import Auditor
from insitu.specs import TaskSpec
from tasks.claims import committed_counts, judged_metrics
from tasks.evaluate import read_validation


def open_server(ex: Exchange, training: TrainingConfig, sites: list[str],
                encoding: UpdateEncoding | None = None) -> ParameterServer:
    """The job's parameter server: a new one at version 0, or the state a previous attempt left (resume)."""
    limit = update_limit(training)
    assert limit is not None, "open_server is for federation.mode: async"
    server = ParameterServer(ex, build_algorithm(training.federation.asynchronous), sites, training.rounds, limit,
                             max_update_norm=MAX_UPDATE_NORM, committed=committed_counts(ex, sites),
                             encoding=encoding)
    if server.version or server.decisions:
        get_run_logger().info("async job %s resumed: version %d of %d, %d update(s) decided before", ex.job_id,
                              server.version, server.target, server.decisions)
    return server


# No cache: a decision is never replayed from one.
@task(task_run_name="async-update-{arrival.site}-{arrival.seq}", cache_policy=NO_CACHE)
def apply_update(server: ParameterServer, arrival: Arrival, audit: Auditor, flow_run_id: str | None) -> dict[str, Any]:
    """Decide one arrived update; audit a refusal; commit (new version, notice, server state, newest pointer).

    Returns ``{"receipt": …, "result": …}``: the decision, and the new version's result when one was made.
    """
    logger = get_run_logger()
    pending = server.decide(arrival)
    r = pending.receipt
    if not r.accepted:
        # a refused claim adds its rule, what, claimed and committed rows
        claim = {k: v for k, v in (pending.claim.as_audit() if pending.claim else {}).items()
                 if k not in ("site", "reason")}
        audit.append("update.refused", job_id=server.ex.job_id, flow_run_id=flow_run_id, site=r.site, seq=r.seq,
                     base_version=r.base_version, version=r.version, staleness=r.staleness, reason=r.reason,
                     **claim)
        logger.warning("update %d of %s refused (the site is told to refresh): %s", r.seq, r.site, r.reason)
    result = server.commit(pending)
    if result is not None:
        logger.info("version %d of %d from %s (staleness %s, weight %s)", r.version, server.target,
                    [e.site for e in r.applied], [e.staleness for e in r.applied],
                    [round(e.weight, 4) for e in r.applied])
    elif r.accepted:
        logger.info("update %d of %s buffered (staleness %d, %d of %d)", r.seq, r.site, r.staleness,
                    len(server.state.buffer), server.algorithm.config.buffer_size)
    return {"receipt": {"site": r.site, "seq": r.seq, "accepted": r.accepted, "staleness": r.staleness,
                        "version": r.version, "reason": r.reason}, "result": result}


def serve(server: ParameterServer, deadline_s: float, is_alive: Callable[[str], bool], audit: Auditor,
          flow_run_id: str | None, on_version: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    """Apply updates as they arrive until the target version; ``on_version`` is called with each new version's
    result (and first with those a resumed job made before). Returns every version's result.

    Raises
    ------
    StalledError
        When no update arrived within ``deadline_s`` or every site's run ended first.
    """
    results = server.results()
    for r in results:
        on_version(r)
    while not server.done:
        for arrival in server.wait(deadline_s, is_alive):
            out = apply_update(server, arrival, audit, flow_run_id)
            if out["result"] is not None:
                out["result"]["refused_total"] = sum(server.refused.values())
                results.append(out["result"])
                on_version(out["result"])
            if server.done:
                break
    return results


def run_async(ex: Exchange, sites: list[str], training: TrainingConfig, task_spec: TaskSpec, selection: Selection,
              is_alive: Callable[[str], bool], audit: Auditor, flow_run_id: str | None,
              on_version: Callable[[dict[str, Any]], None],
              on_validation: Callable[[int, RoundValidation, dict[str, dict[str, Any]]], None],
              encoding: UpdateEncoding | None = None) -> RoundsOutcome:
    """The async job's training phase on the coordinator: serve until the target version, then read the sites'
    validations (each site validated the versions it pulled, and every one the final version) and select the
    last version (async mode registers the last; see ``TrainingConfig``'s check)."""
    deadline = training.federation.round_deadline_s
    server = open_server(ex, training, sites, encoding)
    results = serve(server, deadline, is_alive, audit, flow_run_id, on_version)
    last = server.version
    collect(ex, validation(last), sites, deadline, is_alive)  # the final version's: may still be on their way
    committed = committed_counts(ex, sites)
    for v in range(last + 1):
        per_site = read_validation(ex, v, sites)
        judged = judged_metrics(per_site, committed, task_spec, training.validation, selection.metric.name, "val",
                                f"the validation of global version {v}", audit, ex.job_id, flow_run_id, selection)
        if judged.sites:
            on_validation(v, selection.observe(v, judged.metrics, judged.sites), per_site)
    selected, why = selection.selected(last)
    return RoundsOutcome(results, last, selected, why, False, selection)
