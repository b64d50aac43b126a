"""The exchange: the one store both the coordinator and the sites may write.

Everything written here crosses a border, so it is restricted to a few *kinds* of artefact (weights,
updates, aggregate statistics, metrics, plans, summaries, control markers) and laid out so that every
byte is attributable to its writer and kind::

    jobs/<job_id>/<kind>/<writer>/<name>

:meth:`Exchange.ledger` lists a job's prefix and sums the bytes per writer and kind, which is the
byte accounting the job reports. Binary artefacts carry a manifest (``<name>.manifest.json``) with
their SHA-256, size and sample count; readers verify the hash.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import time
from collections import defaultdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from insitu.storage import Store

if TYPE_CHECKING:  # torch is imported where weights are (de)serialised: prepare never pays for it
    import torch

log = logging.getLogger(__name__)

KINDS = ("plan", "stats", "weights", "update", "metrics", "summary", "control")


class ExchangeError(RuntimeError):
    """An artefact is missing, corrupt, or not allowed on the exchange."""


def _check_aggregate(obj: Any, where: str = "$") -> None:
    """Refuse payloads that look like rows: tables and long lists of records."""
    if hasattr(obj, "to_dict") and hasattr(obj, "columns"):  # a DataFrame
        raise ExchangeError(f"{where}: a table may not be written to the exchange (rows never cross a border)")
    if isinstance(obj, dict):
        for k, v in obj.items():
            _check_aggregate(v, f"{where}.{k}")
    elif isinstance(obj, list):
        if obj and all(isinstance(x, dict) for x in obj) and len(obj) > 1000:
            raise ExchangeError(f"{where}: {len(obj)} records look like rows; only aggregates may cross")
        for i, v in enumerate(obj[:1000]):
            _check_aggregate(v, f"{where}[{i}]")


def state_to_bytes(state: dict[str, torch.Tensor]) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in state.items()}, buf)
    return buf.getvalue()


def state_from_bytes(data: bytes) -> dict[str, torch.Tensor]:
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


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
            raise ExchangeError(f"kind {kind!r} may not be written to the exchange; allowed: {KINDS}")
        return f"jobs/{self.job_id}/{kind}/{writer or self.writer}/{name}"

    def _path(self, key: str) -> str:
        return self.store.path(key)

    # ------------------------------------------------------------------ writes
    def put_bytes(self, kind: str, name: str, data: bytes) -> str:
        key = self.key(kind, name)
        if self.store.url.startswith("file://"):  # object stores have no directories to create
            self.fs.makedirs(self._path(key).rsplit("/", 1)[0], exist_ok=True)
        with self.fs.open(self._path(key), "wb") as f:
            f.write(data)
        return key

    def put_json(self, kind: str, name: str, obj: Any) -> str:
        _check_aggregate(obj)
        return self.put_bytes(kind, name, json.dumps(obj, sort_keys=True, default=str).encode())

    def put_state(self, kind: str, name: str, state: dict[str, torch.Tensor], **meta: Any) -> dict[str, Any]:
        """Write a state dict and its manifest (hash, size, metadata); returns the manifest."""
        if kind not in ("weights", "update"):
            raise ExchangeError(f"model state goes under 'weights' or 'update', not {kind!r}")
        data = state_to_bytes(state)
        manifest = {
            "job_id": self.job_id,
            "writer": self.writer,
            "name": name,
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
            "created": datetime.now(UTC).isoformat(),
            **meta,
        }
        self.put_bytes(kind, f"{name}.pt", data)
        # The manifest goes last: its presence means the payload is complete.
        self.put_json(kind, f"{name}.manifest.json", manifest)
        return manifest

    # ------------------------------------------------------------------ reads
    def exists(self, kind: str, name: str, writer: str | None = None) -> bool:
        return bool(self.fs.exists(self._path(self.key(kind, name, writer))))

    def get_bytes(self, kind: str, name: str, writer: str | None = None) -> bytes:
        path = self._path(self.key(kind, name, writer))
        try:
            with self.fs.open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise ExchangeError(f"missing on the exchange: {path}") from None

    def get_json(self, kind: str, name: str, writer: str | None = None) -> Any:
        return json.loads(self.get_bytes(kind, name, writer))

    def get_state(
        self, kind: str, name: str, writer: str | None = None
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Read a state dict, verifying it against its manifest's SHA-256."""
        manifest = self.get_json(kind, f"{name}.manifest.json", writer)
        data = self.get_bytes(kind, f"{name}.pt", writer)
        digest = hashlib.sha256(data).hexdigest()
        if digest != manifest["sha256"]:
            raise ExchangeError(
                f"{self.key(kind, name + '.pt', writer)}: SHA-256 {digest[:12]}… does not match its "
                f"manifest {manifest['sha256'][:12]}… (corrupt or tampered)"
            )
        return state_from_bytes(data), manifest

    def wait_for(
        self, kind: str, name: str, writer: str | None = None, timeout: float = 600.0, poll: float = 0.5
    ) -> bool:
        """Wait until an artefact exists; False on timeout."""
        return self.wait_for_any([(kind, name, writer)], timeout, poll) is not None

    def wait_for_any(
        self, candidates: list[tuple[str, str, str | None]], timeout: float = 600.0, poll: float = 0.5
    ) -> tuple[str, str, str | None] | None:
        """Wait until one of ``(kind, name, writer)`` exists; returns it, or None on timeout."""
        deadline = time.monotonic() + timeout
        paths = [(c, self._path(self.key(*c))) for c in candidates]
        while True:
            self.fs.invalidate_cache()
            for c, path in paths:
                if self.fs.exists(path):
                    return c
            if time.monotonic() >= deadline:
                return None
            time.sleep(poll)

    def delete(self, kind: str, name: str) -> None:
        """Remove one of this writer's artefacts (e.g. a stale control marker); no error if absent."""
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
    def ledger(self) -> dict[str, dict[str, int]]:
        """Bytes on the exchange for this job, per writer and kind."""
        prefix = self._path(f"jobs/{self.job_id}/")
        self.fs.invalidate_cache()
        out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        try:
            found = self.fs.find(prefix, detail=True)
        except FileNotFoundError:
            return {}
        for path, info in found.items():
            rel = path[len(prefix.rstrip("/")) + 1 :]
            parts = rel.split("/")
            if len(parts) < 3:
                continue
            kind, writer = parts[0], parts[1]
            out[writer][kind] += int(info.get("size") or 0)
        return {w: dict(k) for w, k in out.items()}
