"""Error feedback's memory: what a lossy update encoding left out, kept on the site's own store.

The residual never crosses the border (it is this site's training signal, not a model). It is written under
the update it belongs to, after that update is published, and read back before the next one as the newest
residual of an *earlier* update: a retried or re-run update therefore starts from the residual its first try
started from, never from its own.

    residual = load_residual(store, job_id, "round-0003")       # kept after round 2 (or 1, if 2 was missed)
    payload, residual = encoding.encode(trained, global_state, residual)
    ... publish ...
    save_residual(store, job_id, "round-0003", residual)
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from insitu.storage import Store

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

SUFFIX = ".safetensors"


def feedback_dir(job_id: str) -> str:
    return f"checkpoints/{job_id}/feedback"


def save_residual(store: Store, job_id: str, name: str, residual: torch.Tensor) -> None:
    """Keep ``residual`` as what update ``name`` (round-NNNN or async-NNNNNN) left out."""
    from insitu.federated.state_bytes import payload_to_bytes

    store.write_bytes(f"{feedback_dir(job_id)}/{name}{SUFFIX}", payload_to_bytes({"residual": residual}))
    # Keep this one and the one before it (a retry of this update reads that one); older ones are never read.
    for path in _earlier(store, job_id, name)[:-1]:
        try:
            store.fs.rm_file(path)
        except FileNotFoundError:
            pass


def _earlier(store: Store, job_id: str, name: str) -> list[str]:
    """The residuals of this job's updates of ``name``'s kind named before it, oldest first."""
    kind = name.rsplit("-", 1)[0]
    found = store.fs.glob(store.path(f"{feedback_dir(job_id)}/{kind}-*{SUFFIX}"))
    return sorted(p for p in found if p.rsplit("/", 1)[-1].removesuffix(SUFFIX) < name)


def load_residual(store: Store, job_id: str, name: str, numel: int) -> torch.Tensor | None:
    """The residual of the newest update before ``name`` (names of one kind sort in order), or None.

    A residual that is not a float32 vector of ``numel`` values (another model, a damaged file) is not used:
    error feedback restarts from zero, with a warning; the update itself is still exact to its encoding.
    """
    import torch

    from insitu.federated.state_bytes import payload_from_bytes

    earlier = _earlier(store, job_id, name)
    if not earlier:
        return None
    path = earlier[-1]
    try:
        residual = payload_from_bytes(store.fs.cat_file(path))["residual"]
    except Exception as e:  # a damaged file: not worth failing the round for
        log.warning("error feedback restarts from zero: the residual %s is unreadable (%s)", path, e)
        return None
    if residual.dtype != torch.float32 or tuple(residual.shape) != (numel,) or not bool(torch.isfinite(residual).all()):
        log.warning("error feedback restarts from zero: the residual %s is not %d finite float32 values", path, numel)
        return None
    return residual
