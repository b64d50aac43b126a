"""Audit anchors: each actor's log head, recorded outside the actor where nobody can take it back.

A log's own head file proves that nothing was cut from its end, unless the log and its head are rolled
back together, or deleted together. Anchors close that gap: after each site flow the site writes its head
(sequence number and SHA-256 of the last line) as a new object ``anchors/<actor>/<seq>-<sha256>.json`` on
the exchange, and at the end of each job the coordinator countersigns every site's newest anchor into its
own log (``audit.anchor``) and anchors its own head the same way. The exchange's IAM lets each writer add
objects under its own ``anchors/<writer>/`` and nobody delete one (``insitu.governance.iam``), so:

- a log rolled back (or deleted) to before an anchor no longer contains the anchored line: detected;
- a log rewritten from an anchored line on has a different hash there: detected;
- an anchor an attacker adds can only make ``verify`` fail, never hide a rollback.

The key carries the anchor; the object's body repeats it with a timestamp for people reading the bucket.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from insitu.storage import Store

PREFIX = "anchors"
_KEY = re.compile(r"(?:^|/)anchors/(?P<actor>[a-z][a-z0-9-]{0,62})/(?P<seq>\d{12})-(?P<sha>[0-9a-f]{64})\.json$")


@dataclass(frozen=True, order=True)
class Anchor:
    """One recorded head: the line ``seq`` of ``actor``'s log had this SHA-256."""

    seq: int
    sha256: str
    actor: str
    where: str = ""




def anchor_key(actor: str, seq: int, sha256: str) -> str:
    return f"{PREFIX}/{actor}/{seq:012d}-{sha256}.json"


def publish(store: Store, actor: str, seq: int, sha256: str, **details: Any) -> str:
    """Write one anchor object (a new key every time: anchors are never overwritten or deleted)."""
    key = anchor_key(actor, seq, sha256)
    body = {"actor": actor, "seq": seq, "sha256": sha256, "anchored_at": datetime.now(UTC).isoformat(), **details}
    store.write_bytes(key, json.dumps(body, sort_keys=True).encode())
    return key


def publish_head(store: Store, actor: str, h: tuple[int, str] | None, **details: Any) -> Anchor | None:
    """Anchor a head of ``actor``'s log, as its writer reports it (nothing when the log is empty)."""
    if h is None:
        return None
    publish(store, actor, h[0], h[1], **details)
    return Anchor(h[0], h[1], actor, "exchange")


def list_anchors(store: Store, actor: str | None = None) -> list[Anchor]:
    """Every anchor on the store (of one actor, or all), oldest first."""
    prefix = store.path(f"{PREFIX}/{actor}/" if actor else f"{PREFIX}/")
    store.fs.invalidate_cache()
    try:
        found = store.fs.find(prefix)
    except FileNotFoundError:
        return []
    out = []
    for path in found:
        m = _KEY.search(path)
        if m:
            out.append(Anchor(int(m["seq"]), m["sha"], m["actor"], "exchange"))
    return sorted(out)


def countersigned(events: list[dict[str, Any]]) -> list[Anchor]:
    """Anchors of other actors that a (verified) coordinator log countersigned as ``audit.anchor``."""
    return [Anchor(int(e["fields"]["seq"]), str(e["fields"]["sha256"]), str(e["fields"]["anchored_actor"]),
                   "coordinator log")
            for e in events if e.get("event") == "audit.anchor"]


def check(path: str | Path, anchors: list[Anchor]) -> str:
    """Why the log at ``path`` contradicts one of its ``anchors``, or ``""`` when it contains every one.

    Call after :func:`insitu.governance.audit.verify` has checked the chain: a line that matches its anchor
    then vouches for every line before it.
    """
    try:
        lines = Path(path).read_bytes().rstrip(b"\n").split(b"\n")
    except FileNotFoundError:
        lines = []
    lines = [line for line in lines if line]
    for a in sorted(anchors, reverse=True):  # the newest anchor says the most
        if a.seq >= len(lines):
            return (f"rolled back or deleted: an anchor in the {a.where} records line seq {a.seq} "
                    f"({a.sha256[:12]}…), but the log ends at seq {len(lines) - 1}")
        got = hashlib.sha256(lines[a.seq]).hexdigest()
        if got != a.sha256:
            return (f"rewritten: line seq {a.seq} hashes to {got[:12]}…, the anchor in the {a.where} records "
                    f"{a.sha256[:12]}…")
    return ""
