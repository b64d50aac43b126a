"""Where an async job's seconds go beyond training: one line per update a site pushed, and the median.

An async job has no rounds: each site pulls the newest global version, validates it (once per version), trains
an update, publishes it, and waits for the coordinator to decide it (apply it: a new version, buffer it, or
refuse it) before it pulls again. A site's update cycle runs from the decision on its previous update (its
first: the training phase's start) to the decision on this one; the update's overhead is that cycle minus its
train task (the training, reading the version and publishing the update, as a sync round's compute counts it).
With FedAsync every accepted update is one global version, so the median update overhead is the cost per global
version beyond compute (issue #22's target: 1 s).

The parts of a cycle, on the site's path: ``notice_s`` (the previous decision to this update's train or
validation task starting, whichever first: the site's poll, pulling the newest pointer), ``validate_s`` (scoring
a version it had not validated yet, in a thread beside the training: a negative ``validate_to_train_s`` is that
overlap), and ``decided_s`` (the train task's end to the coordinator's decision task ending: its poll noticing the
update, reading, checking and applying it, publishing the version; an update that waited behind another site's
decision waits here too).

Used by ``bench/pipeline_overhead.py --mode async``; pure functions of the job's task runs.
"""

from __future__ import annotations

import re
from datetime import datetime
from statistics import median
from typing import Any

TRAIN = re.compile(r"^train-(?P<site>.+)-async-(?P<seq>\d+)-from-v(?P<version>\d+)$")


def update_cycles(start: dict[str, datetime], end: dict[str, datetime], phase_start: datetime) -> list[dict[str, Any]]:
    """One row per update whose decision task ended: site, seq, version trained from, train task seconds, cycle
    seconds, overhead seconds and the cycle's parts (see the module's doc)."""
    trains: dict[str, list[tuple[int, str, int]]] = {}
    for name in start:
        if (m := TRAIN.match(name)) and name in end:
            trains.setdefault(m["site"], []).append((int(m["seq"]), name, int(m["version"])))
    rows = []
    for site, updates in sorted(trains.items()):
        previous = phase_start
        for seq, name, version in sorted(updates):
            decided = end.get(f"async-update-{site}-{seq}")
            if decided is None:  # the job reached its target before this update was decided
                break
            validate = f"validate-{site}-round-{version}"
            # validated in this cycle (submitted before the training, its task may start a moment after it)
            own = validate in start and validate in end and previous <= start[validate] <= end[name]
            first = min(start[validate], start[name]) if own else start[name]
            train_s = (end[name] - start[name]).total_seconds()
            cycle_s = (decided - previous).total_seconds()
            rows.append({"site": site, "seq": seq, "from_version": version, "train_task_s": round(train_s, 2),
                         "cycle_s": round(cycle_s, 2), "overhead_s": round(cycle_s - train_s, 2),
                         "notice_s": round((first - previous).total_seconds(), 2),
                         "validate_s": round((end[validate] - start[validate]).total_seconds(), 2) if own else 0.0,
                         "validate_to_train_s": round((start[name] - end[validate]).total_seconds(), 2) if own
                         else 0.0,
                         "decided_s": round((decided - end[name]).total_seconds(), 2)})
            previous = decided
    return rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The medians over every update (each part's median on its own), and how many there were."""
    if not rows:
        return {"updates": 0}
    parts = ("overhead_s", "train_task_s", "notice_s", "validate_s", "validate_to_train_s", "decided_s")
    return {"updates": len(rows), **{f"median_{k}": round(median(r[k] for r in rows), 2) for k in parts}}
