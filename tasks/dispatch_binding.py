"""The site's side of :mod:`insitu.governance.dispatch`: wait for the coordinator's dispatch of this run, check it,
record the admission once, audit every refusal."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from insitu.federated.exchange import Exchange
from insitu.federated.kinds import COORDINATOR, ExchangeError
from insitu.federated.paths import dispatch
from insitu.federated.polling import backoff
from insitu.governance.audit_service import Auditor
from insitu.governance.dispatch import (
    WAIT_S,
    DispatchRefused,
    admission_key,
    dispatch_refusal,
    once_refusal,
    request_digest,
)
from insitu.storage import Store


def read_dispatch(exchange: Exchange, phase: str, site: str, flow_run_id: str | None,
                  wait_s: float = WAIT_S) -> dict[str, Any] | None:
    """The coordinator's dispatch of ``phase`` on ``site`` once it names ``flow_run_id`` (or, after ``wait_s``,
    whatever is there: None when nothing, or a malformed document)."""
    doc = dispatch(phase, site)
    deadline = time.monotonic() + (wait_s if flow_run_id else 0)
    pause = backoff(0.5)  # the coordinator writes it just after creating the run: usually seen at the first looks
    while True:
        record = None
        try:
            if exchange.exists(doc, writer=COORDINATOR):
                record = exchange.get_json(doc, writer=COORDINATOR)
        except ExchangeError:
            record = None
        if (record and record.get("flow_run_id") == flow_run_id) or time.monotonic() >= deadline:
            return record
        time.sleep(min(next(pause), max(0.0, deadline - time.monotonic())))


def _recorded(store: Store, key: str) -> dict[str, Any] | None:
    try:
        return json.loads(store.fs.cat_file(store.path(key)))  # one GET: rides out an outage
    except FileNotFoundError:
        return None


def bind_to_dispatch(audit: Auditor, exchange: Exchange, store: Store, site: str, phase: str,
                     flow_run_id: str | None, received: dict[str, Any], principal: str | None) -> dict[str, Any]:
    """Admit this run only as the coordinator dispatched it, and only once; audit a refusal before raising it.
    Returns the dispatch (whether the run goes on to the job's next phase: ``goes_on``).

    Raises
    ------
    DispatchRefused
        Rule ``dispatch.ticket``, ``dispatch.parameters`` or ``dispatch.run-once``.
    """
    job_id = received["job_id"]
    record = read_dispatch(exchange, phase, site, flow_run_id)
    refusal = dispatch_refusal(record, site=site, phase=phase, flow_run_id=flow_run_id, received=received)
    key = admission_key(job_id, phase, str(flow_run_id))
    if refusal is None:
        refusal = once_refusal(_recorded(store, key), site=site, phase=phase, job_id=job_id,
                               flow_run_id=str(flow_run_id))
    digest = request_digest(received.get("request"))
    if refusal:
        audit.append("dispatch.refused", job_id=job_id, flow_run_id=flow_run_id, phase=phase, rule=refusal[0],
                     principal=principal, request=digest, reason=f"{refusal[1]}; rule {refusal[0]}")
        raise DispatchRefused(*refusal)
    store.write_bytes(key, json.dumps({"job_id": job_id, "phase": phase, "flow_run_id": flow_run_id,
                                       "request": digest, "admitted_at": datetime.now(UTC).isoformat()}).encode())
    assert record is not None  # no refusal: the dispatch names this run
    return record
