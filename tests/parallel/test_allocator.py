"""The allocator tuning a training rank gets on a Dask worker (``insitu.parallel.allocator``), measured in a real
process started with Dask's nanny environment: page faults of a tensor allocated, filled and freed again and again
(1 MiB before and inside ``training_allocator``, 4 MiB after it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dask
import distributed  # noqa: F401  (its config holds the nanny's environment)
import pytest

from insitu.parallel.allocator import _glibc

SCRIPT = r"""
import json, os, resource, sys, torch
from insitu.parallel.allocator import training_allocator

for assignment in sys.argv[1:]:  # set after start, as Dask's nanny does in its own process: glibc never saw it
    os.environ.__setitem__(*assignment.split("=", 1))

def faults(numel, n=200):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n):
        t = torch.empty(numel)
        t.fill_(1.0)
        del t
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

MIB = 262144  # 1 MiB of fp32: over the 128 KiB mmap threshold the variable freezes
out = {"before": faults(MIB)}
with training_allocator() as changed:
    out["inside"], out["changed"] = faults(MIB), changed
# After: blocks larger than any the heap kept free inside (glibc serves a request from a free heap chunk that
# fits before it looks at the mmap threshold), so only the threshold decides between heap and a fresh mmap.
out["after"] = faults(4 * MIB)
print(json.dumps(out))
"""


def _run(env: dict[str, str], set_later: dict[str, str] | None = None) -> dict[str, int]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    later = [f"{k}={v}" for k, v in (set_later or {}).items()]
    out = subprocess.run([sys.executable, "-c", SCRIPT, *later], env={**base, **env}, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


glibc = pytest.mark.skipif(_glibc() is None, reason="glibc's allocator")


@glibc
def test_dask_workers_trim_setting_is_lifted_while_training_and_put_back_after() -> None:
    nanny_env = {k: str(v) for k, v in dask.config.get("distributed.nanny.pre-spawn-environ").items()}
    assert "MALLOC_TRIM_THRESHOLD_" in nanny_env  # what this tunes for: Dask's default, as the site workers get it
    r = _run(nanny_env)
    # Each 1 MiB tensor is a fresh mmap (256 pages faulted in) with the variable; reused heap inside.
    assert r["changed"] is True
    assert r["before"] > 200 * 200, r
    assert r["inside"] < r["before"] / 10, r
    assert r["after"] > 200 * 4 * 200, r  # the worker's own setting is back once training ends: 4 MiB mmaps


@glibc
@pytest.mark.parametrize("set_later", [{}, {"MALLOC_TRIM_THRESHOLD_": "65536"}], ids=["nothing", "set-after-start"])
def test_a_process_that_fixed_nothing_is_left_to_glibc(set_later: dict[str, str]) -> None:
    # set-after-start: the process that runs a LocalCluster has the nanny's variables in os.environ, but its own
    # allocator still adjusts itself; fixing its thresholds on the way out would slow it down for good.
    r = _run({}, set_later)
    assert r["changed"] is False
    # glibc's dynamic threshold: after the first free the 1 MiB blocks come from the heap anyway
    assert r["before"] < 200 * 50 and r["inside"] < 200 * 50 and r["after"] < 200 * 50, r
