"""Who and where a flow run is: its site (from the worker's own identity file), its pool, its stores."""

from __future__ import annotations

import os
import pwd
import re
from dataclasses import dataclass
from typing import Any

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext

from insitu.config import Conf, load_conf, trusted_training
from insitu.federated.exchange import Exchange
from insitu.governance.audit import AuditLog
from insitu.governance.identity import Identity, IdentityError, check_pool, load_identity, refuse_runtime_overrides
from insitu.storage import Store, store_from_env

JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


@dataclass
class SiteContext:
    site: str
    conf: Conf
    store: Store
    exchange: Exchange
    audit: AuditLog
    flow_run_id: str | None
    ran_as: dict[str, str]


def current_flow_run_id() -> str | None:
    """This flow run's id from the engine's own context (not ``prefect.runtime``, which env vars can override)."""
    ctx = FlowRunContext.get()
    return str(ctx.flow_run.id) if ctx and ctx.flow_run else None


def flow_run_pool(flow_run_id: str | None) -> str | None:
    """The work pool the Prefect API says this flow run was submitted to (None when run directly)."""
    if flow_run_id is None:
        return None
    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id).work_pool_name


def ran_as(ident: Identity) -> dict[str, str]:
    """Who ran a step, as the summary reports it: the actor, its OS user and its pool."""
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        user = str(os.geteuid())
    return {"actor": ident.actor, "os_user": user, "pool": ident.work_pool}


def actor_identity(role: str, job_id: str | None) -> tuple[Identity, str | None]:
    """This process's identity, checked: right role, no runtime overrides, the flow run is on its pool.

    Every refusal is audited in the actor's own log before it is raised.
    """
    ident = load_identity()
    fr_id = current_flow_run_id()
    if ident.role != role:
        raise IdentityError(f"this flow needs a {role} worker; {ident.actor!r} is a {ident.role}")
    refuse_runtime_overrides(ident, fr_id)
    check_pool(ident, flow_run_pool(fr_id), fr_id, job_id)
    return ident, fr_id


def site_context(job_id: str, training: str, dataset: str, overrides: dict[str, Any] | None) -> SiteContext:
    """Resolve this site's identity and stores; refuse to run anywhere but on this site's own pool."""
    logger = get_run_logger()
    ident, fr_id = actor_identity("site", job_id)
    site = ident.actor
    if not JOB_ID.match(job_id):
        raise ValueError(f"job_id {job_id!r} must match {JOB_ID.pattern}")
    conf = load_conf(trusted_training(training), dataset, overrides=overrides)
    cfg = conf.sites.site(site)
    if cfg.work_pool != ident.work_pool:
        raise IdentityError(f"conf/sites.yaml puts site {site!r} on pool {cfg.work_pool!r} but this worker serves "
                            f"{ident.work_pool!r}: fix sites.yaml or the site's identity file {ident.path}")
    logger.info("site identity: site=%s pool=%s flow_run=%s (from this worker's own identity file)", site,
                ident.work_pool, fr_id)
    return SiteContext(
        site=site,
        conf=conf,
        store=store_from_env(cfg, site),
        exchange=Exchange(store_from_env(conf.sites.exchange, "exchange"), job_id, writer=site),
        audit=ident.audit(),
        flow_run_id=fr_id,
        ran_as=ran_as(ident),
    )
