"""The catalogue of exchange objects (insitu.federated.paths) against the protocol (insitu.federated.schemas).

Every entry must be an artefact of the protocol for the party that writes it, and for no other: a catalogue
that drifted from the protocol would have a flow write what the exchange refuses, or wait for what never comes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from protocol_examples import evaluation, global_state, store

from insitu.federated import paths
from insitu.federated.exchange import Exchange
from insitu.federated.kinds import COORDINATOR, KINDS, ExchangeError
from insitu.federated.paths import (
    ABORT,
    ASYNC_STATE,
    CHAMPION,
    EVALUATION,
    GLOBAL_STATS,
    NEWEST,
    PLAN,
    PREPARE_STATS,
    STOP,
    SUMMARY,
    Document,
    Kind,
    State,
    aggregator_state,
    async_buffer,
    async_update,
    dispatch,
    global_weights,
    refresh,
    round_name,
    update,
    validation,
    weights,
)
from insitu.federated.schemas import artefact

SITE = "eu"
ROUNDS = (0, 7, 12345)

# Every entry of the catalogue and who writes it; a round's entries for each of ROUNDS.
ENTRIES: dict[str, tuple[Callable[[int], Document | State], str]] = {
    "PLAN": (lambda r: PLAN, COORDINATOR),
    "GLOBAL_STATS": (lambda r: GLOBAL_STATS, COORDINATOR),
    "SUMMARY": (lambda r: SUMMARY, COORDINATOR),
    "ABORT": (lambda r: ABORT, COORDINATOR),
    "STOP": (lambda r: STOP, COORDINATOR),
    "CHAMPION": (lambda r: CHAMPION, COORDINATOR),
    "weights": (lambda r: weights(round_name(r)), COORDINATOR),
    "global_weights": (global_weights, COORDINATOR),
    "aggregator_state": (aggregator_state, COORDINATOR),
    "PREPARE_STATS": (lambda r: PREPARE_STATS, SITE),
    "EVALUATION": (lambda r: EVALUATION, SITE),
    "update": (update, SITE),
    "validation": (validation, SITE),
    "NEWEST": (lambda r: NEWEST, COORDINATOR),
    "ASYNC_STATE": (lambda r: ASYNC_STATE, COORDINATOR),
    "refresh": (lambda r: refresh(SITE), COORDINATOR),
    "async_buffer": (async_buffer, COORDINATOR),
    "async_update": (async_update, SITE),
    "dispatch": (lambda r: dispatch("prepare", SITE), COORDINATOR),
}


def _catalogue() -> set[str]:
    """The public names of paths that are catalogue entries: objects, and functions that return one."""
    out = set()
    for name in paths.__all__:
        value = getattr(paths, name)
        returns = inspect.signature(value).return_annotation if inspect.isfunction(value) else None
        if isinstance(value, Document | State) or returns in ("Document", "State"):
            out.add(name)
    return out


def test_every_entry_is_checked() -> None:
    assert _catalogue() == set(ENTRIES)


def test_kinds_are_the_protocols() -> None:
    assert tuple(Kind) == KINDS
    assert f"{Kind.WEIGHTS}" == str(Kind.WEIGHTS) == "weights"  # a kind spells its folder wherever it is put


@pytest.mark.parametrize("r", ROUNDS)
@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_entries_are_artefacts_of_their_writer_only(entry: str, r: int) -> None:
    make, writer = ENTRIES[entry]
    other = SITE if writer == COORDINATOR else COORDINATOR
    obj = make(r)
    if isinstance(obj, State):
        names = [(obj.manifest.name, True), (obj.file, False)]
        assert obj.manifest.kind == obj.kind
    else:
        names = [(obj.name, True)]
    for name, is_document in names:
        art = artefact(obj.kind, name, writer)
        assert (art.schema is not None) == is_document, f"{obj.kind}/{name}"
        with pytest.raises(ExchangeError, match="only the"):
            artefact(obj.kind, name, other)


def test_names_of_rounds() -> None:
    assert [round_name(r) for r in ROUNDS] == ["round-0000", "round-0007", "round-12345"]
    assert [global_weights(r) for r in ROUNDS] == [State("weights", n) for n in ("round-0000", "round-0007",
                                                                                  "round-12345")]
    assert global_weights(7).manifest == Document("weights", "round-0007.manifest.json")
    assert global_weights(12345).file == "round-12345.pt"
    assert [update(r).manifest.name for r in ROUNDS] == ["round-0000.manifest.json", "round-0007.manifest.json",
                                                          "round-12345.manifest.json"]
    assert update(7) == State("update", "round-0007")
    assert [aggregator_state(r).name for r in ROUNDS] == ["aggregator-round-0000", "aggregator-round-0007",
                                                           "aggregator-round-12345"]
    assert [validation(r) for r in ROUNDS] == [Document("metrics", f"validation-{n}.json")
                                                for n in ("round-0000", "round-0007", "round-12345")]
    assert weights("champion") == CHAMPION


def test_round_name_is_still_importable_from_rounds() -> None:
    from insitu.federated.rounds import round_name as from_rounds

    assert from_rounds is round_name


def test_exchange_takes_catalogue_objects_and_raw_names_alike(tmp_path: Path) -> None:
    site = Exchange(store(tmp_path), "job-1", SITE)
    coord = Exchange(store(tmp_path), "job-1", COORDINATOR)
    key = site.put_json(EVALUATION, evaluation(SITE))
    assert key == site.key("metrics", "evaluate.json") == "jobs/job-1/metrics/eu/evaluate.json"
    assert coord.exists(EVALUATION, writer=SITE) and coord.exists("metrics", "evaluate.json", writer=SITE)
    assert coord.get_json(EVALUATION, writer=SITE) == coord.get_json("metrics", "evaluate.json", SITE)

    man = coord.put_state(global_weights(0), global_state(), round=0)
    assert (tmp_path / "jobs/job-1/weights/coordinator/round-0000.pt").is_file()
    assert site.get_json(global_weights(0).manifest, writer=COORDINATOR) == man
    state, read = site.get_state(global_weights(0), writer=COORDINATOR)
    assert read == man and all(torch.equal(state[k], v) for k, v in global_state().items())
    assert site.get_state("weights", "round-0000", COORDINATOR)[1] == man

    waited = [(ABORT, COORDINATOR), (global_weights(0).manifest, COORDINATOR)]
    assert site.wait_for_any(waited, timeout=1.0, poll=0.05) == waited[1]
    assert site.wait_for(global_weights(0).manifest, writer=COORDINATOR, timeout=1.0)
    assert site.wait_for_any([("control", "abort.json", COORDINATOR)], timeout=0.1, poll=0.05) is None

    coord.put_abort("stop")
    assert site.get_json(ABORT, writer=COORDINATOR) == {"reason": "stop"}
    coord.delete(ABORT)
    assert not site.exists(ABORT, writer=COORDINATOR)


def test_exchange_refuses_mixed_forms(tmp_path: Path) -> None:
    ex = Exchange(store(tmp_path), "job-1", COORDINATOR)
    with pytest.raises(TypeError, match="writer="):
        ex.get_json(GLOBAL_STATS, COORDINATOR)  # type: ignore[call-overload]  # the writer taken for a name
    with pytest.raises(TypeError, match="model state"):
        ex.exists(global_weights(0))  # type: ignore[call-overload]  # a state exists by its .manifest
    with pytest.raises(TypeError, match="JSON document"):
        ex.get_state(GLOBAL_STATS)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="needs a name"):
        ex.put_state("weights", global_state())  # type: ignore[call-overload]
    assert not list(tmp_path.rglob("*.*"))  # nothing was written
