"""Every object on the exchange, by kind and name: the one place (with the protocol) where their names are spelt.

Flows and tasks address what crosses the exchange through this catalogue, e.g.
``ex.get_json(GLOBAL_STATS, writer=COORDINATOR)`` or ``ex.put_state(global_weights(r + 1), state, ...)``,
instead of repeating ``"stats", "global.json"`` at every call site, where one misspelt name would only show as a
wait that never ends. ``tests/unit/test_paths.py`` checks every entry against the protocol
(:data:`insitu.federated.schemas.ARTEFACTS`) for its writer, so that the two cannot drift apart.

A :class:`Document` is one JSON document. A :class:`State` is a model state, stored as two objects: its
tensors (:attr:`State.file`) and its manifest (:attr:`State.manifest`, a Document written last, so that its
presence means the state is complete: waiting for a state, or asking whether it exists, means asking for its
manifest).

Who writes what: the coordinator writes :data:`PLAN`, :data:`GLOBAL_STATS`, :func:`global_weights`,
:func:`aggregator_state`, :data:`CHAMPION`, :data:`SUMMARY`, :data:`ABORT` and :data:`STOP` (and in async mode
:data:`NEWEST`, :data:`ASYNC_STATE`, :func:`async_buffer` and :func:`refresh`) and :func:`dispatch`; each site
writes its own :data:`PREPARE_STATS`, :func:`update` (async mode: :func:`async_update`), :func:`validation` and
:data:`EVALUATION`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "ABORT",
    "ASYNC_STATE",
    "CHAMPION",
    "EVALUATION",
    "GLOBAL_STATS",
    "MANIFEST_SUFFIX",
    "NEWEST",
    "PLAN",
    "PREPARE_STATS",
    "STATE_SUFFIX",
    "STOP",
    "SUMMARY",
    "Document",
    "Kind",
    "State",
    "aggregator_state",
    "async_buffer",
    "async_update",
    "dispatch",
    "global_weights",
    "refresh",
    "round_name",
    "update",
    "validation",
    "weights",
]


class Kind(StrEnum):
    """The exchange's kinds (:data:`insitu.federated.kinds.KINDS`): the folder an object goes under.

    A ``str``, so a kind goes wherever the exchange takes a kind's name.
    """

    PLAN = "plan"
    STATS = "stats"
    WEIGHTS = "weights"
    UPDATE = "update"
    METRICS = "metrics"
    SUMMARY = "summary"
    CONTROL = "control"


MANIFEST_SUFFIX = ".manifest.json"
STATE_SUFFIX = ".pt"


@dataclass(frozen=True)
class Document:
    """One JSON document on the exchange: ``jobs/<job_id>/<kind>/<writer>/<name>``."""

    # str rather than Kind: the exchange's (kind, name) form builds these from whatever kind it is given, and
    # must refuse an unknown one with its own ExchangeError, not with Kind's ValueError.
    kind: str
    name: str


@dataclass(frozen=True)
class State:
    """A model state on the exchange: the tensors (``<name>.pt``) and their manifest (``<name>.manifest.json``)."""

    kind: str
    name: str

    @property
    def manifest(self) -> Document:
        """The manifest (hash, size, metadata): written last, so its presence means the state is complete."""
        return Document(self.kind, f"{self.name}{MANIFEST_SUFFIX}")

    @property
    def file(self) -> str:
        """The name of the object holding the tensors."""
        return f"{self.name}{STATE_SUFFIX}"


def round_name(r: int) -> str:
    """The name of round ``r``'s global model (and of the sites' updates trained from it)."""
    return f"round-{r:04d}"


# ------------------------------------------------------------------ the coordinator's
PLAN = Document(Kind.PLAN, "plan.json")
GLOBAL_STATS = Document(Kind.STATS, "global.json")
SUMMARY = Document(Kind.SUMMARY, "summary.json")
ABORT = Document(Kind.CONTROL, "abort.json")  # the job failed: sites stop waiting for weights
STOP = Document(Kind.CONTROL, "stop.json")  # training ended early: sites stop after validating
CHAMPION = State(Kind.WEIGHTS, "champion")  # the registry's current champion, scored beside the candidate


def dispatch(phase: str, site: str) -> Document:
    """The coordinator's record of the flow run it created for ``phase`` on ``site`` (and its parameters)."""
    return Document(Kind.CONTROL, f"dispatch-{phase}-{site}.json")


def weights(name: str) -> State:
    """The coordinator's model state called ``name``: a global model's :func:`round_name` or the champion's.

    For names that come as names (the models a site is asked to score); :func:`global_weights` otherwise.
    """
    return State(Kind.WEIGHTS, name)


def global_weights(r: int) -> State:
    """Round ``r``'s global model (round 0: the initial weights)."""
    return weights(round_name(r))


def aggregator_state(r: int) -> State:
    """What the aggregator keeps after producing round ``r``'s global model (e.g. FedAdam's moments)."""
    return weights(f"aggregator-{round_name(r)}")


# ------------------------------------------------------------------ each site's
PREPARE_STATS = Document(Kind.STATS, "prepare.json")
EVALUATION = Document(Kind.METRICS, "evaluate.json")


def update(r: int) -> State:
    """A site's update trained from round ``r``'s global model."""
    return State(Kind.UPDATE, round_name(r))


def validation(r: int) -> Document:
    """A site's metrics of round ``r``'s global model on its validation split."""
    return Document(Kind.METRICS, f"validation-{round_name(r)}.json")


# ------------------------------------------------------------------ async mode (federation.mode: async)
# The coordinator's: the newest global version (what sites pull), its own state as a parameter server (a resumed
# job continues from it), and per site the last refusal ("refresh": pull the newest version).
NEWEST = Document(Kind.CONTROL, "newest.json")
ASYNC_STATE = Document(Kind.CONTROL, "async-state.json")


def refresh(site: str) -> Document:
    """The coordinator's notice to ``site`` that its last refused update was too stale: refresh."""
    return Document(Kind.CONTROL, f"refresh-{site}.json")


def async_buffer(decisions: int) -> State:
    """The parameter server's buffered deltas after its ``decisions``-th decision (FedBuff's buffer).

    Named by the decision count, not overwritten in place: the state document written after it names the one
    that goes with it, so a coordinator stopped between the two still finds a matching pair.
    """
    return weights(f"async-buffer-{decisions:06d}")


def async_update(seq: int) -> State:
    """A site's ``seq``-th update of an async job (its manifest names the global version it trained from)."""
    return State(Kind.UPDATE, f"async-{seq:06d}")
