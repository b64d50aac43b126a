"""Register every deployment through Prefect's deployment API (what ``insitu deploy`` runs).

``retrain/coordinator`` on the coordinator pool, and ``site-prepare|site-train|site-evaluate/<site>``
on each site's pool, and the automation that marks a flow run whose process is gone Crashed
(``deployments/unresponsive.py``). Code is pulled from this checkout's directory (``set_working_directory``), which
is right for process workers on the same machine; for Kubernetes pools point ``source`` at a git
repository or bake an image (see README, "Real infrastructure"). ``retrain/coordinator`` runs on the
schedules ``datasets.yaml`` declares per dataset, and on no others.
"""

from __future__ import annotations

import logging
from pathlib import Path

from prefect import Flow
from prefect.schedules import Cron, Schedule

from deployments.unresponsive import ensure_unresponsive_runs_crash
from deployments.worker_policy import COORDINATOR_FLOWS, SITE_FLOWS
from insitu.conf import ConfigError, DatasetsConfig, ScheduleConfig, SitesConfig, load_training
from tasks.promotion import ensure_registry_lock

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parent.parent
# What the UI's form starts with, and what a run created without parameters gets.
DEFAULT_PARAMETERS: dict[str, object] = {"training": "fraud", "dataset": "fraud"}


def retrain_schedule(dataset: str, entry: ScheduleConfig) -> Schedule:
    """One schedule of ``retrain``: ``entry.cron`` read in ``entry.timezone``, training ``entry.training`` on
    ``dataset``. Raises Prefect's ``ValueError`` for a cron it refuses (e.g. ``61 * * * *``); the time zone
    is checked when the deployment is built, against the list ``ScheduleConfig`` already checked it against."""
    # Prefect merges a schedule's parameters over the deployment's one top-level key at a time, so this
    # `params` replaces the default one whole: the run gets RetrainParams' defaults for everything else.
    # No slug: without slugs Prefect replaces all of a deployment's schedules on every deploy, so an entry
    # removed from datasets.yaml is removed from the server too (with slugs it would stay).
    return Cron(entry.cron, timezone=entry.timezone, active=entry.active,
                parameters={"params": {"dataset": dataset, "training": entry.training}})


def retrain_schedules(datasets: DatasetsConfig) -> list[Schedule]:
    """Every schedule that ``datasets`` declares, dataset by dataset in file order."""
    return [retrain_schedule(name, entry) for name, ds in datasets.datasets.items() for entry in ds.schedules]


def deploy_all(sites: SitesConfig, datasets: DatasetsConfig, source: Path = REPO) -> list[str]:
    """Create or update every deployment; returns their names (``flow/deployment``).

    ``retrain/coordinator`` gets exactly the schedules of ``datasets`` (none declared: none on the server).
    """
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
        schedules=retrain_schedules(datasets),
    ).apply()
    names.append("retrain/coordinator")
    for cfg in sorted((source / "conf" / "training").glob("*.yaml")):
        try:
            model_name = load_training(cfg).registry.model_name
        except ConfigError:
            if cfg.exists():
                raise
            continue  # removed since it was listed (another command's config, gone): nothing to lock
        ensure_registry_lock(model_name)
    ensure_unresponsive_runs_crash()  # a job whose coordinator's host died can be re-run by its id
    log.info("deployed %s", names)
    return names


__all__ = ["deploy_all", "ensure_registry_lock", "retrain_schedule", "retrain_schedules"]
