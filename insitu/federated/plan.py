"""A job's plan and its resume rules, as plain decisions (the ``retrain`` flow applies them).

A job is identified by its ``job_id``; a re-run with the same id resumes it. It may resume only under the
configuration it started with (the plan records its hash), and a job that got past prepare is not prepared
again: its rounds were trained on that data, and new raw data must not mix into a half-trained job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from insitu.conf import Conf


def shard_plan(conf: Conf) -> dict[str, list[str]]:
    """Site → its shard ids: each shard goes only to the site it is pinned to; sites without shards are left out."""
    plan = {s: [sh.id for sh in conf.dataset.shards_of(s)] for s in conf.sites.names}
    return {s: ids for s, ids in plan.items() if ids}


def resume_refusal(before: Mapping[str, Any] | None, config_hash: str, job_id: str, training: str,
                   overrides: Mapping[str, Any]) -> str | None:
    """Why a run may not continue job ``job_id`` whose plan is ``before`` (None: a new job, or the same config)."""
    if before is None or before.get("config_hash") == config_hash:
        return None
    return (f"job {job_id} was started with configuration hash {before.get('config_hash')}; this run's is "
            f"{config_hash} (training {training!r}, overrides {dict(overrides)}). Re-run it with the same training "
            "config and overrides to resume it, or leave job_id empty to start a new job.")


def sites_prepared_before(global_stats_published: bool, prepared: Mapping[str, bool]) -> list[str] | None:
    """The sites whose preparation a resumed job reuses (those that published theirs), or None: prepare now.

    Once the coordinator published the global statistics, rounds may have trained on that preparation, so it
    is reused as it is; before that, nothing trained yet, and preparing again is safe.
    """
    if not global_stats_published:
        return None
    return [s for s, done in prepared.items() if done]
