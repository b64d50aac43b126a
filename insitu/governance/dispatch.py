"""Binding a site flow run to the coordinator's dispatch of it: the shared Prefect credential cannot change what a
site does.

Whoever holds the Prefect API's credential (every site's worker does) can change a scheduled flow run's parameters
(``PATCH /flow_runs/{id}``) and start new runs with parameters copied from another run, signed request included. The
signed request covers who, which dataset, training configuration, actions and overrides; it cannot cover the run
itself (one request serves every phase of a job, and its resumes). So a site admits a run only when:

1. its signed request is admitted by the site's own policy (:mod:`insitu.governance.policy`);
2. the coordinator *dispatched this very run*: when the coordinator creates a site flow run it writes a
   :class:`insitu.federated.documents.control.Dispatch` to the exchange under its own prefix, naming the flow run's
   id (assigned by the Prefect server, never by a caller) and the parameters it created the run with. Only the
   coordinator's exchange key can write there (S3 IAM), and no Prefect credential reaches it. A run the coordinator
   did not create (a copy, whatever its parameters) has no dispatch naming it (rule ``dispatch.ticket``); a run
   whose parameters were changed after it was created differs from its dispatch (rule ``dispatch.parameters``);
3. the site has not admitted this run before: it records each admitted (job, phase, flow run, request digest) in
   its own store; a run forced back to Scheduled and run again is refused (rule ``dispatch.run-once``).

A resumed job is a new ``retrain`` flow run of the coordinator: it creates new site runs and new dispatches, so it
is admitted. What the site then acts on is either signed (dataset, training and its content hash, overrides, job
id) or derived by the site itself (its shards, from the signed dataset and its own ``datasets.yaml``; the rounds,
from the signed training configuration and overrides).
"""

from __future__ import annotations

from typing import Any

from insitu.governance.request import RequestError, parse_signed

RULE_TICKET = "dispatch.ticket"
RULE_PARAMETERS = "dispatch.parameters"
RULE_ONCE = "dispatch.run-once"
RULE_CONFIG = "request.config"
"""A run's parameters name something the site's own configuration does not have (a dataset, a training)."""

WAIT_S = 30.0
"""How long a site waits for its dispatch: the coordinator writes it right after it creates the run, so it is
there long before the site's worker has started the run's process; a run the coordinator did not create waits
this long before it is refused."""


class DispatchRefused(PermissionError):
    """A site flow run is not the run the coordinator dispatched (the message names the rule)."""

    def __init__(self, rule: str, reason: str) -> None:
        super().__init__(f"{reason}; rule {rule}")
        self.rule = rule
        self.reason = reason


def request_digest(request: Any) -> str | None:
    """The signed request's digest (None when there is none, or it is malformed: the policy refuses those)."""
    if not request:
        return None
    try:
        return parse_signed(request).digest()
    except RequestError:
        return None


def bound_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """A site flow run's parameters as a dispatch records them: the request by its digest, no overrides as ``{}``,
    a phase's own parameters (``shards``, ``weights``, ``wait_timeout_s``) only when given."""
    out: dict[str, Any] = {
        "job_id": parameters["job_id"],
        "dataset": parameters["dataset"],
        "training": parameters["training"],
        "overrides": {k: v for k, v in (parameters.get("overrides") or {}).items() if v is not None},
        "request": request_digest(parameters.get("request")),
    }
    for key in ("shards", "weights"):
        if parameters.get(key) is not None:
            out[key] = list(parameters[key])
    if parameters.get("wait_timeout_s") is not None:
        out["wait_timeout_s"] = float(parameters["wait_timeout_s"])
    return out


def dispatch_record(site: str, phase: str, flow_run_id: str, parameters: dict[str, Any],
                    goes_on: bool = False) -> dict[str, Any]:
    """What the coordinator writes (``paths.dispatch(phase, site)``) once it created ``flow_run_id`` (or dispatches
    ``phase`` to it, running): ``goes_on``, the run then waits for the job's next phase."""
    return {"recipient": site, "phase": phase, "flow_run_id": str(flow_run_id),
            "parameters": bound_parameters(parameters), "goes_on": goes_on}


def differences(dispatched: dict[str, Any], received: dict[str, Any]) -> list[str]:
    """The names of the parameters in which the run as received differs from the run as dispatched."""
    mine = bound_parameters(received)
    theirs = {k: v for k, v in dispatched.items() if v is not None}
    return sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))


def dispatch_refusal(record: dict[str, Any] | None, *, site: str, phase: str, flow_run_id: str | None,
                     received: dict[str, Any]) -> tuple[str, str] | None:
    """``(rule, why)`` when ``record`` (the coordinator's dispatch for ``phase`` on ``site``, None: none) does not
    dispatch this run with these parameters; None when it does."""
    job_id = received.get("job_id")
    what = f"site {site!r} refuses {phase} of job {job_id} (flow run {flow_run_id})"
    if flow_run_id is None:
        return RULE_TICKET, f"{what}: it runs outside a Prefect flow run, which no coordinator dispatched"
    if record is None or record.get("flow_run_id") != str(flow_run_id) or record.get("phase") != phase \
            or record.get("recipient") != site:
        dispatched = f"flow run {record.get('flow_run_id')}" if record else "no run"
        return RULE_TICKET, (f"{what}: the coordinator dispatched {dispatched} for this job's {phase} here, not this "
                             "one (a copy of a run, or a run made with the Prefect API: start jobs with "
                             "`insitu run`)")
    diff = differences(record.get("parameters") or {}, received)
    if diff:
        return RULE_PARAMETERS, (f"{what}: its parameters {diff} differ from those the coordinator created it with "
                                 "(changed after it was created, through the Prefect API)")
    return None


def admission_key(job_id: str, phase: str, flow_run_id: str) -> str:
    """Where, in its own store, a site records that it admitted this run (a run is admitted once)."""
    return f"admissions/{job_id}/{phase}-{flow_run_id}.json"


def once_refusal(already: dict[str, Any] | None, *, site: str, phase: str, job_id: str,
                 flow_run_id: str) -> tuple[str, str] | None:
    """``(rule, why)`` when the site recorded this run's admission before (``already``), else None."""
    if already is None:
        return None
    return RULE_ONCE, (f"site {site!r} refuses {phase} of job {job_id}: flow run {flow_run_id} was admitted here "
                       f"before (at {already.get('admitted_at', '?')}); a run is admitted once (a re-run of a job "
                       "gets new runs from the coordinator)")
