"""Who and where a flow run is: its site (from the worker's own environment), its pool, its stores."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.runtime import deployment, flow_run

from insitu.config import Conf, load_conf
from insitu.federated.exchange import Exchange
from insitu.governance.audit import AuditLog
from insitu.governance.residency import ResidencyError, site_identity
from insitu.storage import Store, store_from_env


@dataclass
class SiteContext:
    site: str
    conf: Conf
    store: Store
    exchange: Exchange
    audit: AuditLog
    flow_run_id: str | None


def current_work_pool() -> str | None:
    """The work pool of the deployment this flow run came from (None when run directly)."""
    dep_id = deployment.id
    if not dep_id:
        return None
    with get_client(sync_client=True) as client:
        return client.read_deployment(dep_id).work_pool_name


def site_context(job_id: str, training: str, dataset: str, overrides: dict[str, Any] | None) -> SiteContext:
    """Resolve this site's identity and stores; refuse to run on another site's pool."""
    logger = get_run_logger()
    site = site_identity()
    conf = load_conf(training, dataset, overrides=overrides)
    cfg = conf.sites.site(site)
    audit = AuditLog.from_env(site)
    pool = current_work_pool()
    fr_id = flow_run.get_id()
    if pool is not None and pool != cfg.work_pool:
        msg = f"site {site!r} refuses a flow run from pool {pool!r}: its pool is {cfg.work_pool!r}"
        audit.append("residency.refused", job_id=job_id, flow_run_id=fr_id, rule="residency.site-pool", reason=msg)
        raise ResidencyError(msg)
    logger.info("site identity: site=%s pool=%s flow_run=%s (from this worker's own environment)", site, pool, fr_id)
    return SiteContext(
        site=site,
        conf=conf,
        store=store_from_env(cfg, site),
        exchange=Exchange(store_from_env(conf.sites.exchange, "exchange"), job_id, writer=site),
        audit=audit,
        flow_run_id=fr_id,
    )
