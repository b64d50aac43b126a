"""The Dask preload hook imports torch and the training code in the background of a fresh process."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys, threading
from insitu import warm_imports as warm
assert "torch" not in sys.modules, "importing the hook must not import torch itself"
warm.dask_setup(None)
(thread,) = [t for t in threading.enumerate() if t.name == "insitu-warm-imports"]
thread.join(120)
missing = [m for m in ("torch", *warm.MODULES) if m not in sys.modules]
assert not missing, missing
"""


def test_dask_setup_imports_the_training_code_in_a_thread() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
