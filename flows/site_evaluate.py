"""``site-evaluate``: runs on a site's own pool; scores global models on the site's own test split.

A site's evaluation normally runs in its one run of the job, once the rounds are over
(:func:`tasks.site_evaluation.evaluate_when_dispatched`): the coordinator starts this flow only for a site whose
run is no longer there to do it (it failed, or was cancelled). Both admit the evaluation alike.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from tasks.context import site_context
from tasks.site_evaluation import evaluate_here


@flow(name="site-evaluate", log_prints=False)
def site_evaluate(
    job_id: str,
    weights: list[str],
    dataset: str = "fraud",
    training: str = "fraud",
    overrides: dict[str, Any] | None = None,
    request: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Score each named global model on this site's test split; publish metrics (never scores)."""
    context = site_context(job_id, training, dataset, overrides, request, "evaluate", {"weights": weights})
    return evaluate_here(context, weights)
