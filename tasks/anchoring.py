"""Anchoring audit heads outside each actor (see ``insitu.governance.anchors``)."""

from __future__ import annotations

from prefect import get_run_logger

from insitu.governance import anchors
from insitu.governance.anchor_signing import load_service_keys
from insitu.governance.audit_service import AuditClient, Auditor
from insitu.storage import Store


def anchor_site(audit: Auditor, exchange: Store, site: str, job_id: str, phase: str) -> None:
    """A site anchors its own log's head on the exchange at the end of each of its flows, as its audit service
    signed it (the site's runtime cannot sign one itself)."""
    if not isinstance(audit, AuditClient):  # a log written directly has no service to vouch for its head
        get_run_logger().warning("site=%s has no audit service: its head is not anchored", site)
        return
    a = anchors.publish_head(exchange, audit.anchor(), job_id=job_id, phase=phase)
    if a is not None:
        get_run_logger().info("site=%s anchored its audit head seq %d (%s…) on the exchange", site, a.seq,
                              a.sha256[:12])


def countersign(audit: Auditor, exchange: Store, sites: list[str], job_id: str) -> None:
    """The coordinator countersigns each site's newest validly signed anchor into its own log, then anchors its
    own head. Objects a site wrote itself under its ``anchors/`` prefix are noise: named, never countersigned."""
    logger = get_run_logger()
    keys = load_service_keys()
    for site in sites:
        found = anchors.list_anchors(exchange, keys, site)
        for n in found.noise:
            logger.warning("site=%s: %s", site, n)
        if found.anchors:
            a = found.anchors[-1]
            audit.append("audit.anchor", job_id=job_id, anchored_actor=site, seq=a.seq, sha256=a.sha256,
                         anchor_id=a.id, noise=len(found.noise))
    if isinstance(audit, AuditClient):
        anchors.publish_head(exchange, audit.anchor(), job_id=job_id, phase="job")
