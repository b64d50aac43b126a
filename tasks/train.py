"""One federated round on a site: fetch the global model, train in-site, publish the update."""

from __future__ import annotations

import os
from typing import Any

from prefect import get_run_logger, task

from insitu.config import TrainingConfig
from insitu.federated.aggregators import build_aggregator
from insitu.federated.kinds import COORDINATOR
from insitu.federated.paths import global_weights, round_name, update
from insitu.parallel import CheckpointRef, DataRef, TrainSpec, train_site
from tasks.context import SiteContext
from tasks.retry import retry_if_transient


@task(retries=2, retry_delay_seconds=2, retry_condition_fn=retry_if_transient,
      task_run_name="train-{ctx.site}-round-{rnd}")
def train_round(ctx: SiteContext, rnd: int, norm: dict[str, Any]) -> dict[str, Any]:
    """Train from the global weights of round ``rnd`` with the configured strategy; publish the update."""
    logger = get_run_logger()
    t = ctx.conf.training
    state, manifest = ctx.exchange.get_state(global_weights(rnd), writer=COORDINATOR)
    job_id = ctx.exchange.job_id
    # A retry of this task (or a re-run of the job) resumes from the round's newest checkpoint (in the site's
    # own store, named like the round's objects on the exchange).
    ckpt = CheckpointRef(ctx.store, f"checkpoints/{job_id}/{round_name(rnd)}", t.checkpoint.every_steps) \
        if t.checkpoint.enabled else None
    spec = TrainSpec(training=t, task=ctx.conf.task(), n_features=len(norm["mean"]), state=state,
                     loss_params=norm["loss_params"], seed=t.seed * 1000 + rnd,
                     data=DataRef(ctx.store, ctx.conf.dataset_name, job_id, "train"), checkpoint=ckpt,
                     site_options=site_options(t, rnd))
    address = os.environ.get(ctx.conf.sites.site(ctx.site).dask.scheduler_env)
    result = train_site(spec, address)
    # The ranks read the site's prepared train split on the site's own Dask workers.
    ctx.audit.append("data.read", what="prepared/train", job_id=job_id, flow_run_id=ctx.flow_run_id, round=rnd,
                     rows=result.n_samples, strategy=t.strategy, ranks=t.ranks_per_site)
    # Checked here against the global weights it was trained from (names, shapes, dtypes, finite, norm bound),
    # so that a bad update fails on its own site with the reason, before anything crosses; the coordinator
    # checks it again when it reads it.
    published = ctx.exchange.put_state(
        update(rnd), result.state, reference=state, round=rnd, n_samples=result.n_samples,
        base_sha256=manifest["sha256"], metrics=result.metrics, ran_as=ctx.ran_as,
    )
    logger.info("site=%s round=%d strategy=%s ranks=%d samples=%d train_loss=%.4f samples/s=%.0f comm=%.3fs "
                "resumed_from_step=%d update=%dB", ctx.site, rnd, t.strategy, t.ranks_per_site, result.n_samples,
                result.metrics["train_loss"], result.metrics["samples_per_s"], result.metrics.get("comm_s", 0.0),
                result.metrics.get("resumed_from_step", 0), published["bytes"])
    return published


def site_options(training: TrainingConfig, rnd: int) -> dict[str, float]:
    """What the aggregator asks sites to train with in round ``rnd`` (e.g. FedProx's ``proximal_mu``).

    Computed from the site's own copy of the training config, not read from the exchange: the coordinator
    cannot change how a site trains beyond what the approved config says.
    """
    return build_aggregator(training.aggregator.name, training.aggregator.options).configure(rnd)
