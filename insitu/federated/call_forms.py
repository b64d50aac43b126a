"""The two ways an :class:`~insitu.federated.exchange.Exchange` call names its object, told apart.

A call names an object of the catalogue (:mod:`insitu.federated.paths`: ``ex.get_json(GLOBAL_STATS,
writer=...)``) or a raw kind and name (``ex.get_json("stats", "global.json", writer=...)``); mixing the two, or
naming a JSON document where a model state is meant (or the reverse), is a TypeError that says how to call.
"""

from __future__ import annotations

from typing import Any

from insitu.federated.kinds import shown
from insitu.federated.paths import Document, State

# The default of the argument that a catalogue call passes one fewer of (put_json(doc, obj) against
# put_json(kind, name, obj)): no caller can pass it, so its presence tells the two forms apart.
UNSET: Any = object()


def named_wrongly(kind: str | Document | State, name: object) -> str:
    """Why a call names its object twice, or not at all (the TypeError's message)."""
    if isinstance(kind, Document | State):
        # e.g. get_json(GLOBAL_STATS, "coordinator"): the writer went where the raw form has the name
        return f"{kind.kind}/{kind.name} is named already: give no name, and the writer as writer="
    return f"kind {shown(kind)} needs a name: pass an object of insitu.federated.paths, or a kind and a name"


def document_of(kind: str | Document, name: str | None = None) -> tuple[str, str]:
    """``(kind, name)`` of a catalogue Document, or of the raw form; TypeError when the two are mixed."""
    if isinstance(kind, State):
        raise TypeError(f"{kind.kind}/{kind.name} is a model state: use get_state/put_state, or its .manifest")
    if isinstance(kind, Document) != (name is None):
        raise TypeError(named_wrongly(kind, name))
    return (kind.kind, kind.name) if isinstance(kind, Document) else (kind, str(name))


def state_of(kind: str | State, name: str | None = None) -> State:
    """The State of a catalogue call, or the one a raw ``(kind, name)`` call names; TypeError when mixed."""
    if isinstance(kind, Document):
        raise TypeError(f"{kind.kind}/{kind.name} is a JSON document: use get_json/put_json")
    if isinstance(kind, State) != (name is None):
        raise TypeError(named_wrongly(kind, name))
    return kind if isinstance(kind, State) else State(kind, str(name))
