"""Loaded by every Dask worker of a site when it starts (``dask worker --preload insitu.warm_imports``): imports
torch and the training and preparation code in the background, once the worker is up.

A worker that first meets torch inside a job's first round imports it there: on a fresh 2-core platform the six
rank processes of the demo's three sites did so at once, and round 0's training task took 34 s against 4 s in
later rounds (``bench/pipeline_overhead.py``). Importing at start, before the worker registers, made the platform
start 40 s slower instead (six imports at once on two cores). In a thread after start, the import overlaps what
follows ``insitu up`` (seeding, deploying, the job's own flow-run starts); a task that needs a module meanwhile
waits on Python's import lock for the same import, never runs it twice.
"""

from __future__ import annotations

import importlib
import logging
import threading
from typing import Any

log = logging.getLogger(__name__)

MODULES = ("insitu.parallel.rank", "insitu.data.prepare")  # torch, the models, the training loop; pandas, pyarrow


def _warm() -> None:
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # a broken install shows in the first task that needs it, with its own traceback
            log.warning("could not pre-import %s", name, exc_info=True)


def dask_setup(worker: Any) -> None:
    """Dask's preload hook: start the imports without delaying the worker's start."""
    threading.Thread(target=_warm, name="insitu-warm-imports", daemon=True).start()
