"""The exchange protocol: every artefact a party may write, by kind and name, with its schema and size.

An artefact that is not in :data:`ARTEFACTS` may not be written, and is not read. Every JSON document is
checked against its schema when written (by the writer, to fail early) and again when read (by the reader,
which trusts nobody's checks but its own). The schemas are the documents of :mod:`insitu.federated.documents`
(one module per step of a job); they forbid unknown keys, bound every string, list and mapping, and type every
value, so that no row fits in them. A state file (``.pt``) is checked by :mod:`insitu.federated.states` instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import ValidationError

from insitu.federated.documents.base import Doc
from insitu.federated.documents.control import Abort, AsyncState, Dispatch, Newest, Refresh, Stop
from insitu.federated.documents.evaluation import Evaluation, Validation
from insitu.federated.documents.manifests import AsyncUpdateManifest, UpdateManifest, WeightsManifest
from insitu.federated.documents.plan import GlobalStats, Plan, PrepareStats
from insitu.federated.documents.summary import Summary
from insitu.federated.kinds import (
    COORDINATOR,
    KIB,
    MAX_MANIFEST_BYTES,
    MAX_STATE_BYTES,
    MIB,
    VALIDATION_BYTES,
    ExchangeError,
    shown,
)


@dataclass(frozen=True)
class Artefact:
    """One kind of artefact: where it goes, who writes it, its byte bound and its schema.

    ``schema`` is None for a state file, whose checks are in :mod:`insitu.federated.states`.
    """

    kind: str
    pattern: re.Pattern[str]
    writer: Literal["coordinator", "site"]
    max_bytes: int
    schema: type[Doc] | None


_STATE = r"(round-\d{4,5}|champion|aggregator-round-\d{4,5}|async-buffer-\d{6,7})"
_ASYNC_UPDATE = r"async-\d{6,7}"
ARTEFACTS: tuple[Artefact, ...] = (
    Artefact("plan", re.compile(r"plan\.json"), "coordinator", 256 * KIB, Plan),
    Artefact("stats", re.compile(r"prepare\.json"), "site", 64 * KIB, PrepareStats),
    Artefact("stats", re.compile(r"global\.json"), "coordinator", 256 * KIB, GlobalStats),
    Artefact("weights", re.compile(_STATE + r"\.manifest\.json"), "coordinator", MAX_MANIFEST_BYTES, WeightsManifest),
    Artefact("weights", re.compile(_STATE + r"\.pt"), "coordinator", MAX_STATE_BYTES, None),
    Artefact("update", re.compile(r"round-\d{4,5}\.manifest\.json"), "site", MAX_MANIFEST_BYTES, UpdateManifest),
    Artefact("update", re.compile(r"round-\d{4,5}\.pt"), "site", MAX_STATE_BYTES, None),
    Artefact("metrics", re.compile(r"evaluate\.json"), "site", 256 * KIB, Evaluation),
    Artefact("metrics", re.compile(r"validation-round-\d{4,5}\.json"), "site", VALIDATION_BYTES, Validation),
    Artefact("summary", re.compile(r"summary\.json"), "coordinator", 4 * MIB, Summary),
    Artefact("control", re.compile(r"abort\.json"), "coordinator", 8 * KIB, Abort),
    Artefact("control", re.compile(r"stop\.json"), "coordinator", 8 * KIB, Stop),
    Artefact("update", re.compile(_ASYNC_UPDATE + r"\.manifest\.json"), "site", MAX_MANIFEST_BYTES,
             AsyncUpdateManifest),
    Artefact("update", re.compile(_ASYNC_UPDATE + r"\.pt"), "site", MAX_STATE_BYTES, None),
    Artefact("control", re.compile(r"newest\.json"), "coordinator", 8 * KIB, Newest),
    Artefact("control", re.compile(r"async-state\.json"), "coordinator", 256 * KIB, AsyncState),
    Artefact("control", re.compile(r"refresh-[a-z][a-z0-9-]{0,30}\.json"), "coordinator", 8 * KIB, Refresh),
    Artefact("control", re.compile(r"dispatch-(prepare|train|evaluate)-[a-z][a-z0-9-]{0,30}\.json"), "coordinator",
             8 * KIB, Dispatch),
)


def role(writer: str) -> Literal["coordinator", "site"]:
    return "coordinator" if writer == COORDINATOR else "site"


def artefact(kind: str, name: str, writer: str) -> Artefact:
    """The protocol's entry for ``kind/name`` written by ``writer``; ExchangeError if there is none."""
    where = f"{shown(kind, False)}/{shown(name, False)} of {shown(writer, False)}"
    found = [a for a in ARTEFACTS if a.kind == kind and a.pattern.fullmatch(name)]
    if not found:
        known = sorted({a.pattern.pattern.replace("\\", "") for a in ARTEFACTS if a.kind == kind})
        raise ExchangeError(f"{where}: not an artefact of the exchange protocol; {shown(kind)} allows {known}")
    mine = [a for a in found if a.writer == role(writer)]
    if not mine:
        raise ExchangeError(f"{where}: only the {found[0].writer} writes {shown(kind, False)}/{shown(name, False)}")
    return mine[0]


def check_document(art: Artefact, data: bytes, where: str, *, job_id: str, writer: str, name: str) -> Doc:
    """Validate the bytes of a JSON artefact against its schema and its place on the exchange.

    Raises
    ------
    ExchangeError
        Naming ``where`` (kind, name, writer) and the offending keys; never the values, which may be rows.
    """
    if art.schema is None:
        raise ExchangeError(f"{where}: a state file is not a JSON document")
    if len(data) > art.max_bytes:
        raise ExchangeError(f"{where}: {len(data):,} bytes; at most {art.max_bytes:,} are allowed")
    try:
        doc = art.schema.model_validate_json(data, strict=True)
    except ValidationError as e:
        raise ExchangeError(f"{where}: refused by the protocol: {explain(e)}") from None
    # A document says where it belongs; it must be where it is (no replaying another site's or job's).
    claims = {"job_id": job_id, "writer": writer, "site": writer, "name": name.split(".", 1)[0],
              # a notice (refresh-<site>, dispatch-<phase>-<site>) names whom it is for
              "recipient": re.sub(r"^(refresh-|dispatch-[a-z]+-)", "", name.split(".", 1)[0])}
    for field, expected in claims.items():
        if field in type(doc).model_fields and getattr(doc, field) != expected:
            raise ExchangeError(f"{where}: its {field!r} is {shown(getattr(doc, field))}, not {shown(expected)}")
    return doc


def explain(e: ValidationError, limit: int = 5) -> str:
    """The offending keys and what is wrong with each; input values are left out (they may be rows)."""
    parts = []
    for err in e.errors(include_input=False, include_url=False, include_context=False)[:limit]:
        loc = ".".join(x if x == "[key]" else shown(x, False) for x in err["loc"]) or "$"
        msg = "key not allowed by the protocol" if err["type"] == "extra_forbidden" else err["msg"]
        parts.append(f"{loc}: {msg}")
    more = e.error_count() - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
