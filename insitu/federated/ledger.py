"""The byte accounting of a job's prefix on the exchange: bytes per writer and kind, and the objects that are
no artefact of the protocol.

Both read a listing of ``jobs/<job_id>/`` (each object's path below it, ``<kind>/<writer>/<name>``, and its
size), which :meth:`insitu.federated.exchange.Exchange.ledger` and ``strays`` take from the store; every byte
there is counted as having crossed a border.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from insitu.federated.kinds import shown
from insitu.federated.schemas import ARTEFACTS, role


def bytes_by_writer(objects: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """Bytes per writer and kind of a job's objects (paths below the job's prefix → sizes)."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for rel, size in objects.items():
        parts = rel.split("/")
        if len(parts) < 3:
            continue
        kind, writer = parts[0], parts[1]
        out[writer][kind] += size
    return {w: dict(k) for w, k in out.items()}


def stray_objects(objects: Mapping[str, int]) -> list[str]:
    """A sentence for each object that is no artefact of the protocol (a name, kind or writer it does not know),
    in path order."""
    out = []
    for rel in sorted(objects):
        parts = rel.split("/")
        known = len(parts) == 3 and any(a.kind == parts[0] and a.writer == role(parts[1])
                                        and a.pattern.fullmatch(parts[2]) for a in ARTEFACTS)
        if not known:
            out.append(f"{'/'.join(shown(p, False) for p in parts)} is not an artefact of the protocol")
    return out
