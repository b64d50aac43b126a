"""``site-train``: runs on a site's own pool; every federated round of the job is a task inside it, and so is the
site's evaluation (:mod:`tasks.site_training`).

A site normally trains in its ``site-prepare`` run, once its preparation is published and the coordinator
dispatches training to that run: the coordinator starts this flow only where that run is not there to do it (a
resumed job that reuses its preparation, a site whose prepare run ended). Both admit the training alike.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from tasks.context import site_context
from tasks.site_training import train_here


@flow(name="site-train", log_prints=False)
def site_train(
    job_id: str,
    dataset: str = "fraud",
    training: str = "fraud",
    overrides: dict[str, Any] | None = None,
    request: dict[str, Any] | None = None,
    wait_timeout_s: float = 900.0,
) -> dict[str, Any]:
    """Every round of the job: wait for the global weights, train locally, publish the update; then score the
    models the coordinator dispatches for the job's evaluation."""
    context = site_context(job_id, training, dataset, overrides, request, "train", {"wait_timeout_s": wait_timeout_s})
    return train_here(context, wait_timeout_s)
