"""One federated round on a site: fetch the global model, train in-site, publish the update."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from insitu.conf import TrainingConfig
from insitu.federated.aggregators import build_aggregator
from insitu.federated.feedback import load_residual, save_residual
from insitu.federated.kinds import COORDINATOR
from insitu.federated.paths import State, async_update, global_weights, round_name, update
from insitu.federated.publish_delay import PUBLISH_DELAY_FILE, publish_delay
from insitu.governance.identity import ENV_IDENTITY
from insitu.parallel import CheckpointRef, DataRef, TrainSpec
from insitu.parallel.site import train_site
from tasks.context import SiteContext
from tasks.retry import retry_if_transient


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2, retry_condition_fn=retry_if_transient,
      task_run_name="train-{ctx.site}-round-{rnd}")
def train_round(ctx: SiteContext, rnd: int, norm: dict[str, Any],
                validated: Callable[[], None] | None = None) -> dict[str, Any]:
    """Train from the global weights of round ``rnd`` with the configured strategy; publish the update once
    ``validated()`` returned (the round's validation, scored meanwhile, is published first)."""
    t = ctx.conf.training
    state, manifest = ctx.exchange.get_state(global_weights(rnd), writer=COORDINATOR)
    # A retry of this task (or a re-run of the job) resumes from the round's newest checkpoint (in the site's
    # own store, named like the round's objects on the exchange).
    result = train_from(ctx, state, norm, seed=t.seed * 1000 + rnd, checkpoint=round_name(rnd), options_round=rnd,
                        round=rnd)
    # Checked here against the global weights it was trained from (names, shapes, dtypes, finite, norm bound),
    # so that a bad update fails on its own site with the reason, before anything crosses; the coordinator
    # checks it again when it reads it.
    published = publish(ctx, update(rnd), result.state, state, validated, round=rnd, n_samples=result.n_samples,
                        base_sha256=manifest["sha256"], metrics=result.metrics, ran_as=ctx.ran_as)
    _log_trained(ctx, f"round={rnd}", result, published)
    return published


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2, retry_condition_fn=retry_if_transient,
      task_run_name="train-{ctx.site}-async-{seq}-from-v{version}")
def train_async_update(ctx: SiteContext, seq: int, version: int, norm: dict[str, Any],
                       validated: Callable[[], None] | None = None) -> dict[str, Any]:
    """Async mode: train this site's update ``seq`` from global version ``version``; publish it tagged with
    that version (the coordinator measures its staleness against it) once ``validated()`` returned."""
    t = ctx.conf.training
    state, manifest = ctx.exchange.get_state(global_weights(version), writer=COORDINATOR)
    # Seeds and checkpoints are keyed by the site's own sequence number: a retried or re-run update
    # resumes its own checkpoint, and two updates from the same version do not train on the same shuffle.
    result = train_from(ctx, state, norm, seed=t.seed * 1000 + 500 + seq, checkpoint=f"async-{seq:06d}",
                        options_round=version, seq=seq, version=version)
    published = publish(ctx, async_update(seq), result.state, state, validated, seq=seq, base_version=version,
                        n_samples=result.n_samples, base_sha256=manifest["sha256"], metrics=result.metrics,
                        ran_as=ctx.ran_as)
    _log_trained(ctx, f"async update={seq} from version={version}", result, published)
    return published


def publish(ctx: SiteContext, target: State, trained: dict[str, Any], reference: dict[str, Any],
            validated: Callable[[], None] | None = None, **meta: Any) -> dict[str, Any]:
    """Put this site's update on the exchange, encoded as the job's ``federation.compression`` says, once
    ``validated()`` returned (the validation of the model it trained from goes first: see
    :func:`insitu.federated.site_rounds.validated_first`).

    A lossy encoding's residual (what it left out) stays in the site's own store, and is added to the next
    update (error feedback): it is saved only once the update it belongs to is published.
    """
    if validated is not None:
        validated()
    encoding = ctx.conf.encoding
    if encoding is None:
        return ctx.exchange.put_state(target, trained, reference=reference, **meta)
    job_id = ctx.exchange.job_id
    numel = sum(v.numel() for v in reference.values() if v.is_floating_point())
    residual = load_residual(ctx.store, job_id, target.name, numel) if encoding.keeps_residual else None
    payload, residual = encoding.encode(trained, reference, residual)
    published = ctx.exchange.put_state(target, payload, reference=reference, encoding=encoding, **meta)
    if residual is not None:
        save_residual(ctx.store, job_id, target.name, residual)
    return published


def train_from(ctx: SiteContext, state: dict[str, Any], norm: dict[str, Any], *, seed: int, checkpoint: str,
               options_round: int, **audited: Any) -> Any:
    """In-site training of ``state`` on this site's train split (the strategy's ranks on the site's Dask
    workers), then the configured simulated delay; returns :func:`insitu.parallel.site.train_site`'s result."""
    t = ctx.conf.training
    job_id = ctx.exchange.job_id
    ckpt = CheckpointRef(ctx.store, f"checkpoints/{job_id}/{checkpoint}", t.checkpoint.every_steps) \
        if t.checkpoint.enabled else None
    spec = TrainSpec(training=t, task=ctx.conf.task, n_features=len(norm["mean"]), state=state,
                     loss_params=norm["loss_params"], seed=seed,
                     data=DataRef(ctx.store, ctx.conf.dataset_name, job_id, "train"), checkpoint=ckpt,
                     site_options=site_options(t, options_round))
    address = os.environ.get(ctx.conf.sites.site(ctx.site).dask.scheduler_env)
    result = train_site(spec, address)
    # The ranks read the site's prepared train split on the site's own Dask workers.
    ctx.audit.append("data.read", what="prepared/train", job_id=job_id, flow_run_id=ctx.flow_run_id,
                     rows=result.n_samples, strategy=t.strategy, ranks=t.ranks_per_site, **audited)
    delay = publish_delay(_own_file(PUBLISH_DELAY_FILE), job_id, options_round)
    if delay:  # this site's operator made it deliberately slow (tests and benchmarks of stragglers)
        get_run_logger().info("site=%s: waiting %.1fs before publishing (its operator's %s)", ctx.site, delay,
                              PUBLISH_DELAY_FILE)
        time.sleep(delay)
    return result


def _own_file(name: str) -> str | None:
    """A file beside this site's identity file (the site's own home, set up by the site's platform), or None."""
    path = Path(os.environ[ENV_IDENTITY]).parent / name
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _log_trained(ctx: SiteContext, what: str, result: Any, published: dict[str, Any]) -> None:
    t = ctx.conf.training
    get_run_logger().info(
        "site=%s %s strategy=%s ranks=%d samples=%d train_loss=%.4f samples/s=%.0f comm=%.3fs resumed_from_step=%d "
        "update=%dB (%s)", ctx.site, what, t.strategy, t.ranks_per_site, result.n_samples, result.metrics["train_loss"],
        result.metrics["samples_per_s"], result.metrics.get("comm_s", 0.0), result.metrics.get("resumed_from_step", 0),
        published["bytes"], published.get("encoding") or "fp32 state dict")


def site_options(training: TrainingConfig, rnd: int) -> dict[str, float]:
    """What the aggregator asks sites to train with in round ``rnd`` (e.g. FedProx's ``proximal_mu``).

    Computed from the site's own copy of the training config, not read from the exchange: the coordinator
    cannot change how a site trains beyond what the approved config says.
    """
    return build_aggregator(training.aggregator.name, training.aggregator.options).configure(rnd)
