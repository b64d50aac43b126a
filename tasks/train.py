"""One federated round on a site: fetch the global model, train locally, publish the update."""

from __future__ import annotations

from typing import Any

import numpy as np
from prefect import get_run_logger, task

from insitu.federated.rounds import round_name
from insitu.models.fraud_mlp import build_model
from insitu.parallel import train_site
from tasks.context import SiteContext


@task(retries=2, retry_delay_seconds=2, task_run_name="train-{ctx.site}-round-{rnd}")
def train_round(
    ctx: SiteContext, rnd: int, x: np.ndarray, y: np.ndarray, n_features: int, pos_weight: float
) -> dict[str, Any]:
    """Train on the site's data from the global weights of round ``rnd``; publish the update."""
    logger = get_run_logger()
    t = ctx.conf.training
    state, manifest = ctx.exchange.get_state("weights", round_name(rnd), writer="coordinator")
    model = build_model(t.model, n_features)
    model.load_state_dict(state)
    result = train_site(model, x, y, t, pos_weight, seed=t.seed * 1000 + rnd)
    published = ctx.exchange.put_state(
        "update", round_name(rnd), result.state, round=rnd, n_samples=result.n_samples,
        base_sha256=manifest["sha256"], metrics=result.metrics,
    )
    logger.info("site=%s round=%d samples=%d train_loss=%.4f update=%dB", ctx.site, rnd, result.n_samples,
                result.metrics["train_loss"], published["bytes"])
    return published
