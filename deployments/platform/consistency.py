"""What ``insitu up`` checks on a platform that ran before: that what its records refer to is still there.

Prefect's and MLflow's databases and the audit logs live on the operator's disk; the stores keep their objects in
their own directories (:mod:`deployments.platform.s3_disk`). If the two halves disagree — a store's directory
deleted or restored from an older copy — the first job would fail on a missing file. ``up`` reports it first,
one line per store:

- each site store: every shard its audit log says the site read (``data.read`` with a ``shard``) is still there;
- the exchange: the newest job the coordinator's log names still has its objects (``jobs/<job_id>/``), and the
  newest anchor each actor's audit service signed (kept beside its log) is still under ``anchors/``.

Reading only: nothing is repaired or deleted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from insitu.governance.anchor_signing import read_last
from insitu.governance.anchors import anchor_key
from insitu.governance.audit_service import anchor_signing_record
from insitu.governance.audit_verify import read_events
from insitu.storage import Store


@dataclass(frozen=True)
class StoreCheck:
    """One store's finding: ``ok`` and what was checked, or the gaps."""

    store: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{self.store}: {'ok' if self.ok else 'MISSING'} — {self.detail}"


def shards_read(events: list[dict[str, Any]]) -> dict[str, str]:
    """Shard id → the URL its newest ``data.read`` record names."""
    out: dict[str, str] = {}
    for e in events:
        fields = e.get("fields") or {}
        if e.get("event") == "data.read" and fields.get("shard") and fields.get("path"):
            out[str(fields["shard"])] = str(fields["path"])
    return out


def newest_job(events: list[dict[str, Any]]) -> str | None:
    """The job id of the newest record that names one."""
    for e in reversed(events):
        job = (e.get("fields") or {}).get("job_id")
        if job:
            return str(job)
    return None


def check_site_store(site: str, store: Store, events: list[dict[str, Any]]) -> StoreCheck:
    read = shards_read(events)
    if not read:
        return StoreCheck(f"store {site}", True, "its audit log records no shard read yet")
    missing = {s: url for s, url in read.items() if not _exists(store, url)}
    if not missing:
        return StoreCheck(f"store {site}", True, f"all {len(read)} shards its audit log says it read are there")
    shown = ", ".join(f"{s} ({url})" for s, url in sorted(missing.items())[:5])
    return StoreCheck(f"store {site}", False, f"{len(missing)} of {len(read)} shards its audit log says it read "
                      f"are gone: {shown}; put them back with `insitu data put FILE --site {site} --key …`")


def check_exchange(store: Store, coordinator_events: list[dict[str, Any]],
                   last_anchors: dict[str, dict[str, Any] | None]) -> StoreCheck:
    gaps, seen = [], []
    job = newest_job(coordinator_events)
    if job is not None:
        objects = store.fs.find(store.path(f"jobs/{job}/"))
        if objects:
            seen.append(f"newest job {job}: {len(objects)} objects")
        else:
            gaps.append(f"the newest job {job} has no objects under jobs/{job}/ (a re-run by its id starts over)")
    for actor, last in sorted(last_anchors.items()):
        if last is None:
            continue
        key = anchor_key(actor, int(last["seq"]), str(last["sha256"]))
        if _exists(store, store.full_url(key)):
            seen.append(f"{actor}'s newest anchor (seq {last['seq']})")
        else:
            gaps.append(f"{actor}'s newest anchor (seq {last['seq']}, {key}) is gone")
    if gaps:
        return StoreCheck("exchange", False, "; ".join(gaps))
    return StoreCheck("exchange", True, ", ".join(seen) if seen else "no job and no anchor recorded yet")


def check_platform(sites: list[str], audit_log: Callable[[str], Path], open_store: Callable[[str], Store],
                   coordinator: str = "coordinator") -> list[StoreCheck]:
    """Every store's line: the sites' stores, then the exchange (``open_store("exchange")``)."""
    out = []
    for site in sites:
        out.append(_guarded(f"store {site}", lambda s=site: check_site_store(s, open_store(s),
                                                                                read_events(audit_log(s)))))
    last = {a: read_last(anchor_signing_record(audit_log(a))) for a in [coordinator, *sites]}
    out.append(_guarded("exchange", lambda: check_exchange(open_store("exchange"),
                                                           read_events(audit_log(coordinator)), last)))
    return out


def _guarded(name: str, run: Callable[[], StoreCheck]) -> StoreCheck:
    try:
        return run()
    except Exception as e:  # a check that cannot run says so on its own line; it never stops `up`
        return StoreCheck(name, False, f"could not be checked: {type(e).__name__}: {e}")


def _exists(store: Store, url: str) -> bool:
    path = url.split("://", 1)[1] if "://" in url else url
    store.fs.invalidate_cache(path)
    return bool(store.fs.exists(path))
