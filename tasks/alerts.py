"""The coordinator watching its site runs while it waits for them: a paused pool, a forced or cancelled run
(:mod:`insitu.governance.run_alerts`) is audited as ``alert.<kind>``, emitted as the Prefect event
``insitu.alert.<kind>`` (so that an automation can page someone) and kept for the job's summary."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun, WorkPoolStatus
from prefect.events import emit_event
from prefect.exceptions import MissingContextError
from prefect.logging import get_run_logger

from insitu.federated.exchange import Exchange
from insitu.federated.paths import update
from insitu.federated.round_alerts import GATE_REFUSED, dropped, slow
from insitu.governance.audit_service import Auditor
from insitu.governance.run_alerts import Alert, pool_alert, run_alert
from tasks.dispatch import PUBLISHED, published_by

log = logging.getLogger(__name__)



class RunWatch:
    """Alerts of one job; :meth:`on` gives ``tasks.dispatch.wait_for_runs`` its ``on_poll`` for a phase."""

    def __init__(self, audit: Auditor, job_id: str, flow_run_id: str | None, pools: dict[str, str],
                 exchange: Exchange | None) -> None:
        self.audit, self.job_id, self.flow_run_id = audit, job_id, flow_run_id
        self.pools, self.exchange = pools, exchange
        self.alerts: list[Alert] = []
        self._seen: set[tuple[str, ...]] = set()
        self._judged: set[str] = set()
        self._round_started = time.monotonic()
        self._round_seconds: dict[int, float] = {}
        self._dropped: set[str] = set()  # sites alerted as dropped and not back yet

    def round_done(self, rnd: int, result: dict[str, Any], deadline_s: float, slow_factor: float) -> None:
        """After round ``rnd`` was aggregated: alert the sites it went on without, and a slow round (timed from the
        previous round's end, or from when training began)."""
        now = time.monotonic()
        seconds, self._round_started = now - self._round_started, now
        if result.get("resumed"):
            return  # aggregated by an earlier run of the job: not a round this run waited for
        result["seconds"] = round(seconds, 3)  # into the job's summary (`insitu status` shows the last job's)
        sites, missing = list(result.get("sites", [])), list(result.get("missing", []))
        self._dropped -= set(sites)  # back in: a later drop is news again
        for alert in dropped(rnd, missing, result.get("rejected", {}), deadline_s):
            if alert.site not in self._dropped:  # once per absence, not every round a dead site misses
                self._dropped.add(alert.site)
                self._raise(alert)
        alert = slow(rnd, seconds, self._round_seconds, slow_factor, sites)
        self._round_seconds[rnd] = seconds
        if alert is not None:  # name the site the round waited for: one that never came, else the last to come
            waited = sorted(missing)[0] if missing else self._last_update(rnd, sites)
            self._raise(slow(rnd, seconds, self._round_seconds, slow_factor, sites, waited) or alert)

    def _last_update(self, rnd: int, sites: list[str]) -> str | None:
        """The site whose update of round ``rnd`` was written last (the one the round waited for)."""
        if self.exchange is None:
            return None
        try:
            written = {s: self.exchange.modified(update(rnd).manifest, writer=s) for s in sites}
        except Exception:  # detection only: the alert goes out without it
            return None
        known = {s: t for s, t in written.items() if t is not None}
        return max(known, key=lambda s: known[s]) if known else None

    def training_starts(self) -> None:
        self._round_started = time.monotonic()

    def gate_refused(self, model: str, version: str, reason: str) -> None:
        self._raise(Alert(GATE_REFUSED, "", "gate", f"{model} v{version} not promoted: {reason}"))

    def excuse(self, run_ids: Iterable[UUID]) -> None:
        """Runs the coordinator itself cancels (a site left out past a deadline): not judged as forced."""
        self._judged.update(str(r) for r in run_ids)

    def on(self, phase: str) -> Callable[[dict[str, FlowRun]], None]:
        return lambda runs: self.check(phase, runs)

    def check(self, phase: str, runs: dict[str, FlowRun]) -> list[Alert]:
        """Look at each run once per poll; raise each new finding once. Never fails the job: a watch that cannot
        read the API logs why and tries again at the next poll."""
        found: list[Alert] = []
        try:
            with get_client(sync_client=True) as client:
                paused: dict[str, bool] = {}
                for site, run in runs.items():
                    final = bool(run.state and run.state.is_final())
                    if not final and site in self.pools:
                        pool = self.pools[site]
                        if pool not in paused:
                            wp = client.read_work_pool(pool)
                            paused[pool] = bool(wp.is_paused or wp.status == WorkPoolStatus.PAUSED)
                        alert = pool_alert(site, phase, pool, paused[pool], str(run.id))
                        if alert and self._new(alert, (alert.kind, phase, pool)):
                            found.append(alert)
                    elif final and str(run.id) not in self._judged:  # a Completed one too: changed again?
                        self._judged.add(str(run.id))
                        states = sorted(client.read_flow_run_states(run.id), key=lambda s: s.timestamp)
                        alert = run_alert(site, phase, str(run.id), [(s.type.value, s.name or "") for s in states],
                                          self._published(phase, site, run))
                        if alert and self._new(alert, (alert.kind, str(run.id))):
                            found.append(alert)
        except Exception as e:  # the watch is detection, not a step of the job
            _logger().warning("could not check the site runs of job %s for alerts: %s: %s", self.job_id,
                        type(e).__name__, e)
        for alert in found:
            self._raise(alert)
        return found

    def _new(self, alert: Alert, key: tuple[str, ...]) -> bool:
        if key in self._seen:
            return False
        self._seen.add(key)
        return True

    def _published(self, phase: str, site: str, run: FlowRun) -> bool:
        """Whether ``run`` itself published the phase's result: written since the run started (a re-run of the
        job by its id finds its earlier run's result there, and may still fail on its own)."""
        doc = PUBLISHED.get(f"site-{phase}")
        return doc is not None and self.exchange is not None and published_by(self.exchange, doc, site, run)

    def _raise(self, alert: Alert) -> None:
        self.alerts.append(alert)
        _logger().warning("ALERT %s: %s", alert.event, alert.detail)
        self.audit.append(alert.event, job_id=self.job_id, flow_run_id=self.flow_run_id, site=alert.site,
                          phase=alert.phase, pool=alert.pool, site_flow_run_id=alert.flow_run_id, reason=alert.detail)
        related: list[dict[str, Any]] = []
        if alert.flow_run_id:
            related.append({"prefect.resource.id": f"prefect.flow-run.{alert.flow_run_id}",
                            "prefect.resource.role": "site-run"})
        if alert.pool:
            related.append({"prefect.resource.id": f"prefect.work-pool.{alert.pool}",
                            "prefect.resource.role": "work-pool"})
        try:
            emit_event(event=f"insitu.{alert.event}",
                       resource={"prefect.resource.id": f"insitu.job.{self.job_id}",
                                 "prefect.resource.name": self.job_id},
                       related=related, payload=alert.as_record())
        except Exception as e:  # audited already; an event that cannot be sent must not stop the job
            _logger().warning("could not emit the Prefect event for %s: %s", alert.event, e)


def _logger() -> Any:
    """The flow run's logger (shown in the UI) when there is one, else this module's."""
    try:
        return get_run_logger()
    except MissingContextError:
        return log
