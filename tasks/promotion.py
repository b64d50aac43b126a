"""Promotion: the gate judged under the model registry's lock, and the ``champion`` alias moved if it passed.

The decision itself is plain code (``insitu.gate.promotion``); this task reads what the registry holds inside
the lock and writes the outcome back, so that concurrent jobs of one registered model stay consistent.
"""

from __future__ import annotations

from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists

from insitu.gate import Promotion, promotion
from insitu.job import JobSpec
from tasks.registration import Champion


def registry_lock_name(model_name: str) -> str:
    """The Prefect global concurrency limit that serialises the gate for one registered model."""
    return f"insitu-registry-{model_name}"


def ensure_registry_lock(model_name: str) -> None:
    """The global concurrency limit that serialises gate + alias moves for one registered model.

    Created when first needed (idempotent): a new registry name in a training config must not fail a job
    after training because nobody re-ran ``insitu deploy``.
    """
    with get_client(sync_client=True) as client:
        try:
            client.create_global_concurrency_limit(
                GlobalConcurrencyLimitCreate(name=registry_lock_name(model_name), limit=1))
        except ObjectAlreadyExists:
            pass


@task(cache_policy=NO_CACHE, task_run_name="gate-and-promote-{job_id}")
def gate_and_promote(
    conf: JobSpec,
    job_id: str,
    version: str,
    candidate_global: dict[str, float],
    candidate_sites: dict[str, dict[str, float]],
    champion: Champion | None,
    champion_global: dict[str, float] | None,
    champion_sites: dict[str, dict[str, float]] | None,
) -> Promotion:
    """Decide and move the aliases, holding the registry lock so that concurrent jobs stay consistent.

    Inside the lock the current champion is read again; if another job promoted a different version
    since this job evaluated, the candidate is compared with that version's recorded metrics instead.
    """
    logger = get_run_logger()
    client = MlflowClient()
    name = conf.training.registry.model_name
    metric = conf.task.gate_metric(conf.training.gate.primary_metric)
    ensure_registry_lock(name)
    with concurrency(registry_lock_name(name), occupy=1, timeout_seconds=600, strict=True):
        current = _champion_now(client, name)
        outcome = promotion(conf.training.gate, metric, version, client.get_model_version(name, version).tags,
                            candidate_global, candidate_sites, champion.version if champion else None,
                            champion_global, champion_sites,
                            str(current.version) if current is not None else None,
                            current.tags if current is not None else {})
        if outcome.basis == "judged":  # a re-run of a job whose version was already judged: the decision stands
            logger.info("%s v%s was already judged (%s): %s", name, version,
                        "passed" if outcome.passed else "failed", outcome.reason)
            return outcome
        if outcome.basis == "recorded":
            logger.warning("champion moved to v%s since this job evaluated v%s; comparing with its recorded "
                           "metrics", outcome.previous_champion, champion.version if champion else None)
        client.set_model_version_tag(name, version, "gate_reason", outcome.reason)
        if outcome.passed:
            client.set_registered_model_alias(name, "champion", version)
            # The previous champion keeps its version; `challenger` stays on the newest candidate.
        # Written last: a re-run trusts a recorded decision only if everything it implies was done.
        client.set_model_version_tag(name, version, "gate", "passed" if outcome.passed else "failed")
    logger.info("gate %s for %s v%s: %s", "PASSED" if outcome.passed else "FAILED", name, version, outcome.reason)
    return outcome


def _champion_now(client: MlflowClient, name: str) -> ModelVersion | None:
    """The version holding the ``champion`` alias now, or None when there is none."""
    try:
        return client.get_model_version_by_alias(name, "champion")
    except MlflowException:
        return None
