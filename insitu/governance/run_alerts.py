"""Denial of service through the shared Prefect credential, detected: a paused site pool, a site run whose state
was forced.

The credential cannot change what a site does (:mod:`insitu.governance.dispatch`), but its holder can still stall or
drop a site: pause the site's work pool (its runs stay Scheduled), cancel a site's run, or set one to Failed through
the API (``force=True`` bypasses Prefect's orchestration rules). Prefect records no caller on a state, so a forced
state is recognised by what the site's own worker and flow never do:

- a site's run leaves Scheduled only through Pending: its worker proposes Pending before it vets or starts a run
  (a refusal by the worker is Pending → Failed, audited in the site's log). A final state straight after a
  Scheduled (or Late) state was set by someone else;
- a run whose state was final and then changed again was changed by someone else;
- a run that ended Failed, Crashed or Cancelled after its site published this phase's result on the exchange
  (which only the site's own key can write) was ended by someone else;
- a Cancelled run was cancelled through the API: the coordinator cancels a site's run only past a phase's
  deadline, and excuses those runs from this check (``RunWatch.excuse``).

These are pure decisions; ``tasks/alerts.py`` reads the pools and states, audits each alert in the coordinator's
log as ``alert.<kind>``, emits it as a Prefect event ``insitu.alert.<kind>`` (for automations) and the job's
summary names it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

POOL_PAUSED = "pool-paused"
RUN_FORCED = "run-forced"
RUN_CANCELLED = "run-cancelled"
KINDS = (POOL_PAUSED, RUN_FORCED, RUN_CANCELLED)

FINAL = frozenset({"COMPLETED", "FAILED", "CRASHED", "CANCELLED"})
_OWN_PREDECESSORS = frozenset({"PENDING", "RUNNING", "CANCELLING"})


@dataclass(frozen=True)
class Alert:
    """One finding about a job's site run or its pool, as the audit log, the event and the summary carry it."""

    kind: str
    site: str
    phase: str
    detail: str
    pool: str | None = None
    flow_run_id: str | None = None

    @property
    def event(self) -> str:
        """The coordinator's audit event (``alert.pool-paused``, …)."""
        return f"alert.{self.kind}"

    def as_record(self) -> dict[str, str | None]:
        return asdict(self)


def pool_alert(site: str, phase: str, pool: str, paused: bool, flow_run_id: str | None = None) -> Alert | None:
    """An alert when ``pool`` (``site``'s) is paused while a run of the job waits on it."""
    if not paused:
        return None
    return Alert(POOL_PAUSED, site, phase, f"work pool {pool!r} of site {site!r} is paused: the site's {phase} run "
                 "waits and the job stalls (resume it with `prefect work-pool resume`, and find out who paused it)",
                 pool=pool, flow_run_id=flow_run_id)


def forced_state(history: Sequence[tuple[str, str]], published: bool) -> tuple[str, str] | None:
    """``(kind, why)`` when a site run's state history (oldest first: ``(type, name)``, e.g. ``("FAILED",
    "Failed")``) shows a state its site's own worker and flow did not set; None otherwise.

    ``published``: whether the site published this phase's result on the exchange (its own key's doing).
    """
    if not history:
        return None
    last_type, last_name = history[-1]
    for before_type, before_name in history[:-1]:
        if before_type in FINAL:
            return RUN_FORCED, f"the run was {before_name} and was then set {last_name} through the Prefect API"
    if last_type not in FINAL or last_type == "COMPLETED":
        return None
    previous = history[-2][0] if len(history) > 1 else None
    if previous not in _OWN_PREDECESSORS:
        return RUN_FORCED, (f"set {last_name} while {history[-2][1] if previous else 'new'}, before the site's "
                            "worker took it (a worker sets Pending first): through the Prefect API")
    if last_type == "CANCELLED":
        return RUN_CANCELLED, "cancelled through the Prefect API (the coordinator never cancels a site's run)"
    if published:
        return RUN_FORCED, (f"set {last_name} although the site published this phase's result on the exchange: "
                            "through the Prefect API")
    return None


def run_alert(site: str, phase: str, flow_run_id: str, history: Sequence[tuple[str, str]],
              published: bool) -> Alert | None:
    """An alert when :func:`forced_state` finds the run's state forced or cancelled."""
    found = forced_state(history, published)
    if found is None:
        return None
    kind, why = found
    return Alert(kind, site, phase, f"the {phase} run {flow_run_id} of site {site!r}: {why}", flow_run_id=flow_run_id)
