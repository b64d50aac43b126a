"""The whole audit trail: every actor's log verified against its anchors, and merged into one timeline.

What an auditor runs (``insitu audit verify`` / ``insitu audit timeline``): each deployed actor's log must
exist, verify on its own (hash chain, HMACs, head) and contain every anchor recorded for it outside it
(``insitu.governance.anchors``: only anchors signed by the actor's audit service count; anything else under
``anchors/`` is reported as noise, never as a roll-back); the coordinator's log, once verified, vouches for the
site anchors it countersigned. The timeline is every record of every log in time order, for a regulator to read.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from insitu.governance import anchors as anchoring
from insitu.governance.audit import read_events, verify

COORDINATOR = "coordinator"


@dataclass
class TrailResult:
    actor: str
    path: Path
    ok: bool
    lines: int
    anchors: int
    reason: str
    noise: list[anchoring.Noise] = field(default_factory=list)
    """Objects under this actor's ``anchors/`` prefix that are no valid anchor (ignored, but named)."""


def verify_trail(logs: dict[str, tuple[Path, bytes]], found: anchoring.Found) -> list[TrailResult]:
    """Verify each actor's log (``actor → (path, key)``) against the signed anchors ``found`` outside it
    (:func:`insitu.governance.anchors.list_anchors`); its noise is reported with each actor, not counted.

    The coordinator's log is verified first; only a verified coordinator log's countersignatures count.
    """
    stored = found.anchors
    order = sorted(logs, key=lambda a: (a != COORDINATOR, a))
    countersigned: list[anchoring.Anchor] = []
    out = []
    for actor in order:
        path, key = logs[actor]
        r = verify(path, key, required=True)
        mine = [a for a in stored + countersigned if a.actor == actor]
        reason = r.reason
        ok = r.ok
        noise = found.of(actor).noise
        if ok:
            why = anchoring.check(path, mine)
            if why:
                ok, reason = False, why
            elif mine:
                reason += f"; contains all {len(mine)} anchors recorded outside it"
        if noise:
            reason += f"; {len(noise)} objects under anchors/{actor}/ are no signed anchor (noise, ignored)"
        if ok and actor == COORDINATOR:
            countersigned = anchoring.countersigned(read_events(path))
        out.append(TrailResult(actor, path, ok, r.lines, len(mine), reason, noise))
    return out


def timeline(logs: dict[str, Path], job: str | None = None, dataset: str | None = None,
             principal: str | None = None) -> list[dict[str, Any]]:
    """Every record of every log, oldest first, flattened for reading; optionally only one job's, dataset's or
    principal's (a record matches a filter when one of its fields has that value)."""
    rows = []
    for actor, path in logs.items():
        for e in read_events(path):
            f = e.get("fields", {})
            if job and f.get("job_id") != job:
                continue
            if dataset and f.get("dataset") != dataset:
                continue
            if principal and principal not in (f.get("principal"), f.get("claimed_principal")):
                continue
            rows.append({"ts": e["ts"], "log": actor, "seq": e["seq"], "event": e["event"],
                         "job_id": f.get("job_id"), "dataset": f.get("dataset"), "principal": f.get("principal"),
                         "rule": f.get("rule"), "fields": f})
    return sorted(rows, key=lambda r: (r["ts"], r["log"], r["seq"]))


def to_jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)


def to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    cols = ["ts", "log", "seq", "event", "job_id", "dataset", "principal", "rule", "fields"]
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({**r, "fields": json.dumps(r["fields"], sort_keys=True)})
    return buf.getvalue()
