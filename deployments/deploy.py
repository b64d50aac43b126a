"""Register every deployment through Prefect's deployment API (what ``insitu deploy`` runs).

``retrain/coordinator`` on the coordinator pool, and ``site-prepare|site-train|site-evaluate/<site>``
on each site's pool. Code is pulled from this checkout's directory (``set_working_directory``), which
is right for process workers on the same machine; for Kubernetes pools point ``source`` at a git
repository or bake an image (see README, "Real infrastructure").
"""

from __future__ import annotations

import logging
from pathlib import Path

from prefect import Flow
from prefect.schedules import Cron

from deployments.worker_policy import COORDINATOR_FLOWS, SITE_FLOWS
from insitu.config import SitesConfig, load_training
from tasks.registry import ensure_registry_lock

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parent.parent
# Recurring retraining: Mondays 03:00 in the coordinator's timezone, with the default parameters.
WEEKLY_CRON = "0 3 * * 1"
SCHEDULE_TIMEZONE = "Europe/Berlin"
DEFAULT_PARAMETERS: dict[str, object] = {"training": "fraud", "dataset": "fraud"}


def deploy_all(sites: SitesConfig, source: Path = REPO) -> list[str]:
    """Create or update every deployment; returns their names (``flow/deployment``)."""
    names = []
    for flow_name, (entrypoint, _) in SITE_FLOWS.items():
        f = Flow.from_source(source=str(source), entrypoint=entrypoint)
        for s in sites.sites:
            f.to_deployment(name=s.name, work_pool_name=s.work_pool, tags=["insitu", f"site:{s.name}"],
                            description=f"{flow_name} on site {s.name}'s own pool").apply()
            names.append(f"{flow_name}/{s.name}")
    f = Flow.from_source(source=str(source), entrypoint=COORDINATOR_FLOWS["retrain"][0])
    f.to_deployment(
        name="coordinator", work_pool_name=sites.coordinator.work_pool, tags=["insitu", "coordinator"],
        description="Federated retraining across all sites: plan, prepare, train, evaluate, gate, register.",
        parameters={"params": DEFAULT_PARAMETERS},
        schedules=[Cron(WEEKLY_CRON, timezone=SCHEDULE_TIMEZONE, active=True)],
    ).apply()
    names.append("retrain/coordinator")
    for cfg in sorted((source / "conf" / "training").glob("*.yaml")):
        ensure_registry_lock(load_training(cfg).registry.model_name)
    log.info("deployed %s", names)
    return names


__all__ = ["deploy_all", "ensure_registry_lock"]
