"""Prepare a site's shards on the site's own Dask cluster."""

from __future__ import annotations

import os
from typing import Any

from distributed import Client
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from insitu.conf import ShardConfig
from insitu.data.prepare import ShardReport, prepare_shard, summarize
from insitu.federated.kinds import MIN_ROWS
from tasks.context import SiteContext
from tasks.retry import retry_if_transient

# Sums over fewer rows than this would let the exchange reconstruct individual rows (the protocol's floor).
MIN_AGGREGATE_ROWS = MIN_ROWS
# What the protocol lets a shard's error message carry: the start of it says what went wrong, while a long
# message (a parser quoting the file) could carry the shard's content.
MAX_ERROR_CHARS = 300


@task(cache_policy=NO_CACHE, retry_condition_fn=retry_if_transient, retries=1, retry_delay_seconds=5,
      task_run_name="prepare-{ctx.site}")
def prepare_shards(ctx: SiteContext, shards: list[ShardConfig], job_id: str) -> dict[str, Any]:
    """One Dask task per shard on the site's scheduler; returns the site's aggregate summary."""
    logger = get_run_logger()
    address = os.environ.get(ctx.conf.sites.site(ctx.site).dask.scheduler_env)
    if not address:
        env = ctx.conf.sites.site(ctx.site).dask.scheduler_env
        raise RuntimeError(f"{env} is not set: this worker has no Dask cluster for site {ctx.site}")
    t = ctx.conf.training
    schema = ctx.conf.dataset.schema_
    with Client(address, timeout=30) as client:
        futures = [
            client.submit(prepare_shard, ctx.store, s, schema, t.split, ctx.conf.dataset.split_key,
                          ctx.conf.dataset_name, job_id, ctx.policy.limits,
                          pure=False, key=f"prepare-{job_id}-{s.id}")
            for s in shards
        ]
        reports: list[ShardReport] = client.gather(futures)
    raw_bytes = 0
    for s, r in zip(shards, reports, strict=True):
        try:
            raw_bytes += int(ctx.store.fs.size(ctx.store.path(s.path)))
        except FileNotFoundError:
            pass
        ctx.audit.append("data.read", shard=s.id, path=ctx.store.full_url(s.path), job_id=job_id,
                         flow_run_id=ctx.flow_run_id, rows=r.rows_read, quarantined=r.rows_quarantined,
                         error=r.error, malformed_lines=r.malformed_lines[:100])
        if r.refused_rule:
            ctx.audit.append("data.refused", shard=s.id, path=ctx.store.full_url(s.path), job_id=job_id,
                             flow_run_id=ctx.flow_run_id, rule=r.refused_rule, reason=r.error)
        if r.malformed_lines:
            logger.warning("shard %s: %d malformed line(s) quarantined (lines %s%s)", s.id, len(r.malformed_lines),
                           r.malformed_lines[:20], "…" if len(r.malformed_lines) > 20 else "")
        if r.error:
            logger.warning("shard %s quarantined: %s", s.id, r.error)
        elif r.rows_quarantined:
            logger.info("shard %s: %d rows quarantined to %s", s.id, r.rows_quarantined, r.quarantine_path)
    # The protocol's floor, or the site's own if its policy asks for more.
    return publishable(reports, raw_bytes, ctx.site, max(MIN_AGGREGATE_ROWS, ctx.min_rows))


def _top_reasons(r: ShardReport) -> str:
    return "all rows quarantined: " + ", ".join(f"{n} × {rule}" for rule, n in r.reasons.items())


def publishable(reports: list[ShardReport], raw_bytes: int, site: str, floor: int = MIN_AGGREGATE_ROWS
                ) -> dict[str, Any]:
    """The site's summary as the protocol's ``stats/prepare.json`` takes it (the flow adds site and identity).

    Raises
    ------
    ValueError
        When the train split has fewer than ``floor`` rows: its statistics would describe those rows.
    """
    if reports and sum(r.rows_prepared for r in reports) == 0:
        why = "; ".join(f"{r.shard}: {r.error or r.rows_read and _top_reasons(r) or 'no rows'}" for r in reports)
        raise ValueError(f"site {site}: no row of its shards could be prepared, every one was quarantined or "
                         f"unreadable ({why[:1500]}); the quarantine in the site's store has each row's reason")
    summary = summarize(reports)
    for shard in summary["shards"].values():
        if shard["error"] and len(shard["error"]) > MAX_ERROR_CHARS:
            shard["error"] = shard["error"][: MAX_ERROR_CHARS - 1] + "…"
    n_train = summary["train_stats"]["n"]
    if 0 < n_train < floor:
        raise ValueError(
            f"site {site}: only {n_train} training rows; statistics over fewer than {floor} rows "
            "would describe individual rows, so they are not published (add data or leave this site out)")
    summary["raw_bytes"] = raw_bytes
    return summary
