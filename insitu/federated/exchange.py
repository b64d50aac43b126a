"""The exchange: the one store both the coordinator and the sites may write.

Everything written here crosses a border, so only what the protocol (:mod:`insitu.federated.schemas`)
allows may be written: a few *kinds* of artefact (plans, aggregate statistics, weights, updates,
metrics, summaries, control markers), each under fixed names, each JSON document against a strict schema,
each state against the global model's layout (:mod:`insitu.federated.states`). There is no public way to
write raw bytes. Readers check everything again: a site's writes may not have gone through this class.
The layout makes every byte attributable to its writer and kind::

    jobs/<job_id>/<kind>/<writer>/<name>

:meth:`Exchange.ledger` lists a job's prefix and sums the bytes per writer and kind, which is the byte
accounting the job reports and budgets (:func:`insitu.federated.kinds.check_budgets`). A state file
carries a manifest (``<name>.manifest.json``) with its SHA-256, size and sample count; readers verify it.

Objects are named by the catalogue of :mod:`insitu.federated.paths` (``ex.get_json(GLOBAL_STATS,
writer=COORDINATOR)``, ``ex.put_state(global_weights(1), state, ...)``), or by a raw kind and name
(``ex.get_json("stats", "global.json", writer=...)``): the raw form stays so that tests can name, and be
refused, what the catalogue cannot."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

from insitu.federated.call_forms import UNSET, document_of, state_of
from insitu.federated.documents.base import MAX_TEXT
from insitu.federated.kinds import (
    KINDS,
    MAX_UPDATE_NORM,
    ExchangeError,
    ProtocolViolation,
    check_budgets,
    shown,
)
from insitu.federated.ledger import bytes_by_writer, stray_objects
from insitu.federated.paths import ABORT, Document, Kind, State
from insitu.federated.polling import backoff
from insitu.federated.schemas import Artefact, artefact, check_document
from insitu.federated.state_bytes import state_from_bytes, state_to_bytes
from insitu.federated.wire import from_wire, to_wire
from insitu.storage import Store

if TYPE_CHECKING:  # torch is imported where weights are (de)serialised: prepare never pays for it
    import torch

    from insitu.federated.codecs import UpdateEncoding

log = logging.getLogger(__name__)

__all__ = ["KINDS", "Exchange", "ExchangeError", "enforce_protocol", "state_from_bytes", "state_to_bytes"]


# A candidate of wait_for_any: a catalogue Document and its writer, or a raw (kind, name, writer).
Candidate = TypeVar("Candidate", bound=tuple[Document, str | None] | tuple[str, str, str | None])

class Exchange:
    """Read and write one job's artefacts on the exchange store as ``writer``."""

    def __init__(self, store: Store, job_id: str, writer: str) -> None:
        self.store = store
        self.job_id = job_id
        self.writer = writer
        self.fs = store.fs

    # ------------------------------------------------------------------ paths
    def key(self, kind: str, name: str, writer: str | None = None) -> str:
        if kind not in KINDS:
            raise ExchangeError(f"kind {shown(kind)} may not be written to the exchange; allowed: {KINDS}")
        return f"jobs/{self.job_id}/{kind}/{writer or self.writer}/{name}"

    def _path(self, key: str) -> str:
        return self.store.path(key)

    def _where(self, kind: str, name: str, writer: str | None = None) -> str:
        return f"{shown(kind, False)}/{shown(name, False)} of {shown(writer or self.writer, False)} (job {self.job_id})"

    def _protocol(self, kind: str, name: str, writer: str | None = None) -> Artefact:
        self.key(kind, name, writer)  # an unknown kind is refused first, with the list of kinds
        return artefact(kind, name, writer or self.writer)

    # ------------------------------------------------------------------ writes
    def _put_bytes(self, kind: str, name: str, data: bytes) -> str:
        """Write bytes that were already checked against the protocol (private: callers use the typed writers)."""
        key = self.key(kind, name)
        self.store.write_bytes(key, data, self.fs)  # the exchange's one client, as its reads (not one per PUT)
        return key

    def _encode(self, kind: str, name: str, obj: Any) -> bytes:
        """The JSON of ``obj`` as it will be stored, checked against its schema (ExchangeError if refused)."""
        art = self._protocol(kind, name)
        where = self._where(kind, name)
        try:
            data = json.dumps(obj, sort_keys=True, allow_nan=True).encode()
        except (TypeError, ValueError) as e:  # a table, bytes, an object: only plain JSON documents cross
            raise ExchangeError(f"{where}: refused: not a JSON document ({e})") from None
        check_document(art, data, where, job_id=self.job_id, writer=self.writer, name=name)
        return data

    @overload
    def put_json(self, doc: Document, obj: Any, /) -> str: ...
    @overload
    def put_json(self, kind: str, name: str, obj: Any) -> str: ...
    def put_json(self, kind: str | Document, name: Any, obj: Any = UNSET) -> str:
        """Write one of the protocol's JSON documents; ExchangeError naming the offending keys otherwise."""
        if obj is UNSET:  # put_json(doc, obj): the object came where the raw form has the name
            name, obj = None, name
        kind, name = document_of(kind, name)
        return self._put_bytes(kind, name, self._encode(kind, name, obj))

    def put_abort(self, reason: str) -> str:
        """Tell the sites to stop (``control/abort.json``); the reason is cut to what the protocol allows."""
        text = reason if len(reason) <= MAX_TEXT else reason[: MAX_TEXT - 1] + "…"
        return self.put_json(ABORT, {"reason": text})

    @overload
    def put_state(
        self,
        target: State,
        state: dict[str, torch.Tensor],
        /,
        *,
        reference: Mapping[str, torch.Tensor] | None = None,
        max_norm: float = MAX_UPDATE_NORM, encoding: UpdateEncoding | None = None,
        **meta: Any,
    ) -> dict[str, Any]: ...
    @overload
    def put_state(
        self,
        kind: str,
        name: str,
        state: dict[str, torch.Tensor],
        *,
        reference: Mapping[str, torch.Tensor] | None = None,
        max_norm: float = MAX_UPDATE_NORM, encoding: UpdateEncoding | None = None,
        **meta: Any,
    ) -> dict[str, Any]: ...
    def put_state(
        self,
        kind: str | State,
        name: str | dict[str, torch.Tensor],
        state: dict[str, torch.Tensor] = UNSET,
        *,
        reference: Mapping[str, torch.Tensor] | None = None,
        max_norm: float = MAX_UPDATE_NORM, encoding: UpdateEncoding | None = None,
        **meta: Any,
    ) -> dict[str, Any]:
        """Write a state dict and its manifest (hash, size, metadata); returns the manifest.

        An update must name the global state it was trained from (``reference``): it is refused unless it has
        exactly that state's names, shapes and dtypes, is finite, and ``||state - reference||_2 <= max_norm``.
        Nothing is written unless both pass. With ``encoding``, ``state`` is an update's encoded payload.
        """
        if state is UNSET:  # put_state(target, tensors): the tensors came where the raw form has the name
            target, state = state_of(kind), cast("dict[str, torch.Tensor]", name)
        else:
            target = state_of(kind, cast(str, name))
        kind, name = target.kind, target.name
        if kind not in (Kind.WEIGHTS, Kind.UPDATE):
            raise ExchangeError(f"model state goes under 'weights' or 'update', not {shown(kind)}")
        art = self._protocol(kind, target.file)
        where = self._where(kind, target.file)
        if kind == Kind.UPDATE and reference is None:
            raise ExchangeError(f"{where}: an update is checked against the global weights it was trained from; "
                                "pass them as reference=")
        if encoding is not None and kind != Kind.UPDATE:
            raise ExchangeError(f"{where}: only an update is encoded")
        data = to_wire(state, where, reference, max_norm, encoding)
        if len(data) > art.max_bytes:
            raise ExchangeError(f"{where}: {len(data):,} bytes; at most {art.max_bytes:,} are allowed")
        manifest = {
            "job_id": self.job_id,
            "writer": self.writer,
            "name": name,
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
            "created": datetime.now(UTC).isoformat(),
            **({"encoding": encoding.name} if encoding is not None else {}), **meta,
        }
        encoded = self._encode(kind, target.manifest.name, manifest)  # refused before anything is written
        self._put_bytes(kind, target.file, data)
        # The manifest goes last: its presence means the payload is complete.
        self._put_bytes(kind, target.manifest.name, encoded)
        return manifest

    # ------------------------------------------------------------------ reads
    @overload
    def exists(self, doc: Document, /, *, writer: str | None = None) -> bool: ...
    @overload
    def exists(self, kind: str, name: str, writer: str | None = None) -> bool: ...
    def exists(self, kind: str | Document, name: str | None = None, writer: str | None = None) -> bool:
        """Whether an object is there; a state's is its ``.manifest`` (written last)."""
        kind, name = document_of(kind, name)
        path = self._path(self.key(kind, name, writer))
        # s3fs answers exists() from a cached listing of the parent (a ledger() or strays() fills it): an
        # artefact written since would stay invisible. Always ask the store.
        self.fs.invalidate_cache(path)
        return bool(self.fs.exists(path))

    def modified(self, doc: Document, /, *, writer: str | None = None) -> datetime | None:
        """When the store last wrote ``doc`` (UTC), or None when it is not there."""
        path = self._path(self.key(doc.kind, doc.name, writer))
        self.fs.invalidate_cache(path)
        try:
            info = self.fs.info(path)
        except FileNotFoundError:
            return None
        stamp = info.get("LastModified", info.get("mtime"))  # S3's header; a local store's mtime
        if isinstance(stamp, datetime):
            return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)
        return datetime.fromtimestamp(float(stamp), UTC) if stamp is not None else None

    def _get_bytes(self, kind: str, name: str, writer: str | None, limit: int) -> bytes:
        """At most ``limit`` bytes of an artefact: a larger one is refused without being read whole."""
        path = self._path(self.key(kind, name, writer))

        def read() -> bytes:
            opened = 0
            while True:
                opened += 1
                try:
                    with self.fs.raw.open(path, "rb") as f:
                        return bytes(f.read(limit + 1))
                except FileNotFoundError:
                    raise ExchangeError(f"missing on the exchange: {path}") from None
                except OSError as e:
                    # s3fs pins the ETag at open: an object replaced before the read (the async state, the newest
                    # pointer) fails it with FileExpired (EBUSY). Opened again, the new object is read whole.
                    if e.errno != errno.EBUSY or opened == 3:
                        raise
                    self.fs.invalidate_cache(path)

        data = self.store.ride_out(read, what=f"reading {path}")  # opening and reading: both cross the network
        if len(data) > limit:
            raise ExchangeError(f"{self._where(kind, name, writer)}: more than {limit:,} bytes; refused")
        return data

    @overload
    def get_json(self, doc: Document, /, *, writer: str | None = None) -> Any: ...
    @overload
    def get_json(self, kind: str, name: str, writer: str | None = None) -> Any: ...
    def get_json(self, kind: str | Document, name: str | None = None, writer: str | None = None) -> Any:
        """Read one of the protocol's JSON documents, checked against its schema as if we had written it."""
        kind, name = document_of(kind, name)
        art = self._protocol(kind, name, writer)
        data = self._get_bytes(kind, name, writer, art.max_bytes)
        check_document(art, data, self._where(kind, name, writer), job_id=self.job_id, writer=writer or self.writer,
                       name=name)
        return json.loads(data)

    @overload
    def get_state(
        self,
        source: State,
        /,
        *,
        writer: str | None = None,
        reference: Mapping[str, torch.Tensor] | None = None,
        max_norm: float = MAX_UPDATE_NORM, encoding: UpdateEncoding | None = None,
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]: ...
    @overload
    def get_state(
        self,
        kind: str,
        name: str,
        writer: str | None = None,
        *,
        reference: Mapping[str, torch.Tensor] | None = None,
        max_norm: float = MAX_UPDATE_NORM, encoding: UpdateEncoding | None = None,
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]: ...
    def get_state(
        self,
        kind: str | State,
        name: str | None = None,
        writer: str | None = None,
        *,
        reference: Mapping[str, torch.Tensor] | None = None,
        max_norm: float = MAX_UPDATE_NORM, encoding: UpdateEncoding | None = None,
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Read a state dict, verified against its manifest's SHA-256 and checked like :meth:`put_state`.

        With ``reference`` (how the coordinator reads an update) the state must match the global model's
        layout and lie within ``max_norm`` of it. An update encoded otherwise than ``encoding`` (the job's
        ``federation.compression``) says is refused; one encoded so is returned decoded.
        """
        source = state_of(kind, name)
        kind = source.kind
        manifest = self.get_json(source.manifest, writer=writer)
        self._protocol(kind, source.file, writer)
        where = self._where(kind, source.file, writer)
        data = self._get_bytes(kind, source.file, writer, int(manifest["bytes"]))
        digest = hashlib.sha256(data).hexdigest()
        if digest != manifest["sha256"]:
            raise ExchangeError(f"{where}: SHA-256 {digest[:12]}… does not match its manifest "
                                f"{manifest['sha256'][:12]}… (corrupt or tampered)")
        state = from_wire(data, manifest, where, reference, max_norm, encoding)
        return state, manifest

    @overload
    def wait_for(
        self, doc: Document, /, *, writer: str | None = None, timeout: float = 600.0, poll: float = 0.5
    ) -> bool: ...
    @overload
    def wait_for(
        self, kind: str, name: str, writer: str | None = None, timeout: float = 600.0, poll: float = 0.5
    ) -> bool: ...
    def wait_for(self, kind: str | Document, name: str | None = None, writer: str | None = None,
                 timeout: float = 600.0, poll: float = 0.5) -> bool:
        """Wait until an artefact exists (a state: its ``.manifest``); False on timeout."""
        return self.wait_for_any([(*document_of(kind, name), writer)], timeout, poll) is not None

    def wait_for_any(
        self, candidates: Sequence[Candidate], timeout: float = 600.0, poll: float = 0.5
    ) -> Candidate | None:
        """Wait until one of the candidates exists (looking again after 50 ms, then less often, up to every
        ``poll`` seconds); returns it, or None on timeout.

        A candidate is ``(document, writer)`` with a Document of :mod:`insitu.federated.paths` (a state's
        ``.manifest``), or a raw ``(kind, name, writer)``.
        """
        deadline = time.monotonic() + timeout
        paths = [(c, self._path(self.key(*document_of(*c[:-1]), c[-1]))) for c in candidates]
        pause = backoff(poll)
        while True:
            self.fs.invalidate_cache()
            for c, path in paths:
                if self.fs.exists(path):
                    return c
            if time.monotonic() >= deadline:
                return None
            time.sleep(min(next(pause), max(0.0, deadline - time.monotonic())))

    @overload
    def delete(self, doc: Document, /) -> None: ...
    @overload
    def delete(self, kind: str, name: str) -> None: ...
    def delete(self, kind: str | Document, name: str | None = None) -> None:
        """Remove one of this writer's artefacts (e.g. a stale control marker); no error if absent."""
        kind, name = document_of(kind, name)
        # One DeleteObject on the key (not a bulk delete): an IAM policy scoped to this writer's prefix is
        # checked per key, and s3fs would ignore a bulk delete's per-key AccessDenied.
        try:
            self.fs.rm_file(self._path(self.key(kind, name)))
        except FileNotFoundError:
            pass

    def list(self, kind: str, writer: str | None = None) -> list[str]:
        prefix = self._path(f"jobs/{self.job_id}/{kind}/" + (f"{writer}/" if writer else ""))
        self.fs.invalidate_cache()
        try:
            return sorted(self.fs.find(prefix))
        except FileNotFoundError:
            return []

    # ------------------------------------------------------------------ accounting
    def _objects(self) -> dict[str, int]:
        """Every object of this job, as its path below ``jobs/<job_id>/`` and its size."""
        prefix = self._path(f"jobs/{self.job_id}/")
        self.fs.invalidate_cache()
        try:
            found = self.fs.find(prefix, detail=True)
        except FileNotFoundError:
            return {}
        finally:
            self.fs.invalidate_cache()  # do not leave a listing behind that later exists() calls would trust
        return {path[len(prefix.rstrip("/")) + 1 :]: int(info.get("size") or 0) for path, info in found.items()}

    def ledger(self) -> dict[str, dict[str, int]]:
        """Bytes on the exchange for this job, per writer and kind."""
        return bytes_by_writer(self._objects())

    def strays(self) -> list[str]:
        """Objects of this job that are no artefact of the protocol (a name, kind or writer it does not know).

        Nothing reads them, but their presence means a writer went around :class:`Exchange`.
        """
        return stray_objects(self._objects())


def enforce_protocol(ex: Exchange, budgets: Mapping[str, int], when: str) -> None:
    """Fail the job when a site exceeded its per-kind byte budget or left objects outside the protocol.

    The coordinator calls this before it reads what the sites published (each round's updates, the
    evaluation results), so that an oversized or foreign payload is never read at all.

    Raises
    ------
    ProtocolViolation
        Naming every writer, kind and object at fault.
    """
    problems = check_budgets(ex.ledger(), budgets) + ex.strays()
    if problems:
        raise ProtocolViolation(f"{when}: the exchange holds what the protocol does not allow; the job stops: "
                                + "; ".join(problems))
