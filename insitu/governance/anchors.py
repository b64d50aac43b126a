"""Audit anchors: each actor's log head, recorded outside the actor, signed by its audit service, write-once.

A log's own head file proves that nothing was cut from its end, unless the log and its head are rolled
back together, or deleted together. Anchors close that gap: after each site flow the site asks its audit
service to sign its head (sequence number and SHA-256 of the last line, after the previous anchor:
``insitu.governance.anchor_signing``) and writes that as a new object ``anchors/<actor>/<seq>-<sha256>.json``
on the exchange; at the end of each job the coordinator countersigns every site's newest *validly signed*
anchor into its own log (``audit.anchor``) and anchors its own head the same way. The exchange's IAM lets
each writer add objects under its own ``anchors/<writer>/`` and nobody delete one
(``insitu.governance.iam``), and the exchange refuses to overwrite one (S3 Object Lock and a conditional-write
bucket policy in production, the local endpoint's write-once rule in ``deployments.platform.s3``), so:

- a log rolled back (or deleted) to before an anchor no longer contains the anchored line: detected;
- a log rewritten from an anchored line on has a different hash there: detected;
- an object the site's runtime adds itself (any seq, any body) is not signed by its audit service: it is
  reported as noise (its key and why) and ignored; it can neither hide a rollback nor fake one.

The key carries the anchor; the object's body is the signed statement plus a timestamp and the flow's details.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from insitu.governance import anchor_signing
from insitu.storage import Store

log = logging.getLogger(__name__)

PREFIX = "anchors"
RULE_SIGNED = "audit.anchor-signed"
RULE_WRITE_ONCE = "audit.anchor-write-once"
_KEY = re.compile(r"(?:^|/)anchors/(?P<actor>[a-z][a-z0-9-]{0,62})/(?P<seq>\d{12})-(?P<sha>[0-9a-f]{64})\.json$")
MAX_ANCHOR_BYTES = 64 * 1024  # a real anchor is a few hundred bytes; larger objects are noise, not read whole


@dataclass(frozen=True, order=True)
class Anchor:
    """One recorded head: the line ``seq`` of ``actor``'s log had this SHA-256."""

    seq: int
    sha256: str
    actor: str
    where: str = ""
    prev: str = field(default="", compare=False)
    id: str = field(default="", compare=False)


@dataclass(frozen=True)
class Noise:
    """An object under ``anchors/`` that is no valid anchor: where it is and why it does not count."""

    key: str
    why: str

    def __str__(self) -> str:
        return f"{self.key}: {self.why} (ignored; rule {RULE_SIGNED})"


@dataclass
class Found:
    """What the exchange holds under ``anchors/``: the validly signed anchors, and the noise beside them."""

    anchors: list[Anchor] = field(default_factory=list)
    noise: list[Noise] = field(default_factory=list)

    def of(self, actor: str) -> Found:
        return Found([a for a in self.anchors if a.actor == actor],
                     [n for n in self.noise if n.key.startswith(f"{PREFIX}/{actor}/")])


def anchor_key(actor: str, seq: int, sha256: str) -> str:
    return f"{PREFIX}/{actor}/{seq:012d}-{sha256}.json"


def publish(store: Store, signed: Mapping[str, Any], **details: Any) -> str:
    """Write one signed anchor as a new object; never over an existing one (the exchange refuses that too).

    A key that exists already holds this same head (its seq and hash are in the key): the anchor was
    published before, and the existing object is left as it is.
    """
    key = anchor_key(str(signed["actor"]), int(signed["seq"]), str(signed["sha256"]))
    body = {**details, "anchored_at": datetime.now(UTC).isoformat(), **signed}
    try:
        store.write_new(key, json.dumps(body, sort_keys=True).encode())
    except FileExistsError:
        log.info("anchor %s exists already (same head anchored before); left as it is", key)
    return key


def publish_head(store: Store, signed: Mapping[str, Any] | None, **details: Any) -> Anchor | None:
    """Publish the anchor an audit service signed for its head (nothing when the log is empty)."""
    if signed is None:
        return None
    publish(store, signed, **details)
    return Anchor(int(signed["seq"]), str(signed["sha256"]), str(signed["actor"]), "exchange", str(signed["prev"]),
                  anchor_signing.anchor_id(signed))


def list_anchors(store: Store, service_keys: Mapping[str, str], actor: str | None = None) -> Found:
    """Every object under ``anchors/`` (of one actor, or all), read and checked: the anchors validly signed by
    their actor's audit service (public keys ``service_keys``), oldest first, and the rest as noise."""
    prefix = store.path(f"{PREFIX}/{actor}/" if actor else f"{PREFIX}/")
    store.fs.invalidate_cache()
    try:
        listed = store.fs.find(prefix, detail=True)
    except FileNotFoundError:
        return Found()
    found = Found()
    wanted: dict[str, re.Match[str]] = {}
    for path, info in listed.items():
        m = _KEY.search(path)
        if not m:
            found.noise.append(Noise(_rel(path), "not an anchor key (anchors/<actor>/<seq:12>-<sha256>.json)"))
        elif (info.get("size") or 0) > MAX_ANCHOR_BYTES:
            found.noise.append(Noise(_rel(path), f"{info.get('size')} bytes: larger than any anchor"))
        else:
            wanted[path] = m
    bodies = store.fs.cat(list(wanted), on_error="return") if wanted else {}
    for path, m in wanted.items():
        anchor, why = _check_object(bodies.get(path), m, service_keys)
        if anchor is None:
            found.noise.append(Noise(_rel(path), why))
        else:
            found.anchors.append(anchor)
    found.anchors.sort()
    return found


def _rel(path: str) -> str:
    i = path.find(f"{PREFIX}/")
    return path[i:] if i >= 0 else path


def _check_object(data: Any, m: re.Match[str], service_keys: Mapping[str, str]) -> tuple[Anchor | None, str]:
    if not isinstance(data, bytes | bytearray):
        return None, f"unreadable: {data!r}"
    try:
        body = json.loads(data)
    except ValueError:
        return None, "unsigned: not JSON"
    actor, seq, sha = m["actor"], int(m["seq"]), m["sha"]
    why = anchor_signing.refusal(body, actor, seq, sha, service_keys.get(actor))
    if why:
        return None, why
    return Anchor(seq, sha, actor, "exchange", body["prev"], anchor_signing.anchor_id(body)), ""


def countersigned(events: list[dict[str, Any]]) -> list[Anchor]:
    """Anchors of other actors that a (verified) coordinator log countersigned as ``audit.anchor``."""
    return [Anchor(int(e["fields"]["seq"]), str(e["fields"]["sha256"]), str(e["fields"]["anchored_actor"]),
                   "coordinator log")
            for e in events if e.get("event") == "audit.anchor"]


def chain_break(anchors: list[Anchor]) -> str:
    """Why an actor's signed anchors do not form one chain (the service signed two after the same one, or
    one after a later one: its own state was rolled back), or ``""``. A missing link is no break: a site may
    have failed to publish an anchor its service signed."""
    by_id = {a.id: a for a in anchors if a.id}
    after: dict[str, Anchor] = {}
    for a in sorted(a for a in anchors if a.id):
        if a.prev in after and after[a.prev].id != a.id:
            return (f"forked: anchors seq {after[a.prev].seq} and seq {a.seq} both follow the same anchor "
                    "(the audit service's record was rolled back)")
        after[a.prev] = a
        before = by_id.get(a.prev)
        if before is not None and before.seq >= a.seq:
            return f"out of order: the anchor of seq {a.seq} follows the anchor of seq {before.seq}"
    return ""


def check(path: str | Path, anchors: list[Anchor]) -> str:
    """Why the log at ``path`` contradicts one of its ``anchors``, or ``""`` when it contains every one.

    Call after :func:`insitu.governance.audit.verify` has checked the chain: a line that matches its anchor
    then vouches for every line before it. ``anchors`` must be validly signed ones (:func:`list_anchors`)
    or countersigned by a verified coordinator log: nothing else is evidence.
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
    return chain_break(anchors)
