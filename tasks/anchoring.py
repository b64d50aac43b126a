"""Anchoring audit heads outside each actor (see ``insitu.governance.anchors``)."""

from __future__ import annotations

from prefect import get_run_logger

from insitu.governance import anchors
from insitu.governance.audit_service import Auditor
from insitu.storage import Store


def anchor_site(audit: Auditor, exchange: Store, site: str, job_id: str, phase: str) -> None:
    """A site anchors its own log's head on the exchange at the end of each of its flows."""
    a = anchors.publish_head(exchange, site, audit.head(), job_id=job_id, phase=phase)
    if a is not None:
        get_run_logger().info("site=%s anchored its audit head seq %d (%s…) on the exchange", site, a.seq,
                              a.sha256[:12])


def countersign(audit: Auditor, exchange: Store, sites: list[str], job_id: str) -> None:
    """The coordinator countersigns each site's newest anchor into its own log, then anchors its own head."""
    for site in sites:
        found = anchors.list_anchors(exchange, site)
        if found:
            a = found[-1]
            audit.append("audit.anchor", job_id=job_id, anchored_actor=site, seq=a.seq, sha256=a.sha256)
    anchors.publish_head(exchange, "coordinator", audit.head(), job_id=job_id, phase="job")
