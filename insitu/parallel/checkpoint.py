"""Checkpoints of in-site training with ``torch.distributed.checkpoint`` (DCP), in the site's store.

Layout, per job and round: ``checkpoints/<job>/<round>/step-<n>/`` (DCP files written by every rank)
and ``latest.json`` (written by rank 0 after all ranks finished saving), which names the newest
complete checkpoint and the training progress. A retried round loads ``latest.json``'s checkpoint and
skips the batches it already did, so the work lost to a crash is at most one checkpoint interval.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from insitu.outage import is_unreachable
from insitu.parallel.types import CheckpointRef

log = logging.getLogger(__name__)

# Keys are the unwrapped model's parameter names, for the model and (flattened: `state.<fqn>.exp_avg`,
# `param_groups.<fqn>.lr`) for the optimizer. Every strategy then writes the same keys for the same tensors,
# whether a rank holds them whole (DDP), as a shard (FSDP: DTensor) or not at all (another pipeline stage's),
# so DCP re-shards a checkpoint on load and a checkpoint written under one strategy resumes under another.
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _store_was_unreachable(e: BaseException) -> bool:
    """Whether a failed DCP save failed only because the store could not be reached.

    DCP gathers every rank's failure into one :class:`CheckpointException` that every rank raises, so each rank
    reaches the same answer (and skips, or fails, together: a collective stays matched)."""
    failures = [exc for exc, _ in e.failures.values()] if isinstance(e, CheckpointException) else [e]
    return bool(failures) and all(is_unreachable(exc) for exc in failures)


class Checkpointer:
    def __init__(self, ref: CheckpointRef) -> None:
        self.ref = ref
        self.fs = ref.store.fs

    def _latest_path(self) -> str:
        return self.ref.store.path(f"{self.ref.prefix}/latest.json")

    def latest(self) -> dict[str, Any] | None:
        self.fs.invalidate_cache()
        try:
            # One GET of the whole object: reading through fs.open() pins the object's ETag, and rank 0
            # replacing latest.json between the two requests fails the read (s3fs FileExpired).
            return json.loads(self.fs.cat_file(self._latest_path()))
        except FileNotFoundError:
            return None

    def save(self, model: nn.Module, opt: torch.optim.Optimizer, progress: dict[str, int]) -> None:
        """Collective: every rank calls it. Rank 0 publishes ``latest.json`` once all ranks saved."""
        step = progress["global_step"]
        rel = f"{self.ref.prefix}/step-{step:08d}"
        model_sd, optim_sd = get_state_dict(model, opt, options=_OPTIONS)
        url = self.ref.store.full_url(rel)
        if self.ref.store.url.startswith("file://"):
            self.fs.makedirs(self.ref.store.path(rel), exist_ok=True)
        try:
            dcp.save({"model": model_sd, "optim": optim_sd},
                     storage_writer=FsspecWriter(url, **self.ref.store.open_options), no_dist=not _distributed())
        except (CheckpointException, Exception) as e:
            if not _store_was_unreachable(e):
                raise
            # A checkpoint only shortens a retry: the store being down (a restart, a cut) must not fail the round
            # that is training fine. latest.json still names the previous complete checkpoint.
            log.warning("checkpoint at step %d skipped: the store %s was unreachable (%s)", step,
                        self.ref.store.url, str(e).splitlines()[-1][:300])
            return
        if _distributed():
            dist.barrier()
        if not _distributed() or dist.get_rank() == 0:
            previous = self.latest()
            self.fs.pipe_file(self._latest_path(), json.dumps({**progress, "path": rel}).encode())  # rides it out
            if previous and previous.get("path") != rel:
                try:  # keep only the newest complete checkpoint
                    self.fs.rm(self.ref.store.path(previous["path"]), recursive=True)
                except FileNotFoundError:
                    pass
            log.info("checkpoint at step %d -> %s", step, url)

    def restore(self, model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any] | None:
        """Load the newest checkpoint into ``model`` and ``opt``; returns its progress, or None."""
        latest = self.latest()
        if latest is None:
            return None
        model_sd, optim_sd = get_state_dict(model, opt, options=_OPTIONS)
        state = {"model": model_sd, "optim": optim_sd}
        url = self.ref.store.full_url(latest["path"])
        dcp.load(state, storage_reader=FsspecReader(url, **self.ref.store.open_options), no_dist=not _distributed())
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"], options=_OPTIONS)
        log.info("resumed from %s (epoch %d, step %d)", url, latest["epoch"], latest["global_step"])
        return latest
