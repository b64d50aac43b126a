"""Score a model from the exchange on the site's own test split; publish the metrics only.

And, on the coordinator, read what the sites published, after checking they kept to the protocol.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from torch import nn

from insitu.federated.exchange import Exchange, enforce_protocol
from insitu.federated.kinds import COORDINATOR, MIN_ROWS, ExchangeError, site_budgets
from insitu.federated.paths import EVALUATION, global_weights, validation, weights
from insitu.federated.site_rounds import Pending
from insitu.metrics import withheld
from insitu.models import build_model
from insitu.specs import TaskSpec
from insitu.storage import Store
from tasks.context import SiteContext
from tasks.retry import retry_if_transient


def score(model: nn.Module, task: TaskSpec, x: np.ndarray, y: np.ndarray, loss_params: dict[str, Any],
          floor: int = MIN_ROWS) -> dict[str, Any]:
    """The task's metrics of ``model`` on ``(x, y)``: aggregates only (for a binary task, per-class score
    histograms from which the coordinator draws a global PR curve without ever seeing a row's score).

    Over fewer than ``floor`` rows nothing is published but the marker saying so: a loss or a positive rate
    over a handful of rows describes those rows.
    """
    if len(y) < floor:
        return withheld(floor)
    model.eval()
    with torch.no_grad():
        outputs = model(torch.from_numpy(x))
    return task.site_metrics(outputs, y, loss_params, floor)


@task(cache_policy=NO_CACHE, retry_condition_fn=retry_if_transient, retries=1,
      task_run_name="evaluate-{ctx.site}-{name}")
def evaluate_weights(ctx: SiteContext, name: str, x: np.ndarray, y: np.ndarray, norm: dict[str, Any]) -> dict[str, Any]:
    state, _ = ctx.exchange.get_state(weights(name), writer=COORDINATOR)
    task = ctx.conf.task
    model = build_model(ctx.conf.training.model, len(norm["mean"]), task.n_outputs)
    model.load_state_dict(state)
    # The protocol's floor, or the site's own if its policy asks for more.
    return score(model, task, x, y, norm["loss_params"], max(MIN_ROWS, ctx.min_rows))


def evaluations(ex: Exchange, sites: list[str], rounds: int, updates: int | None = None) -> dict[str, dict[str, Any]]:
    """Each site's ``metrics/evaluate.json`` (its ``models``), schema-checked, as the coordinator reads it.

    First every site's bytes on the exchange are checked against its budgets for a job of ``rounds`` rounds
    (and ``updates`` updates per site, in async mode): a site over budget, or with objects outside the protocol,
    stops the job (ProtocolViolation) before anything it wrote is read.
    """
    model_bytes = ex.get_json(global_weights(0).manifest, writer=COORDINATOR)["bytes"]
    enforce_protocol(ex, site_budgets(rounds, int(model_bytes), updates), "evaluate")
    return {s: ex.get_json(EVALUATION, writer=s)["models"] for s in sites}


@task(cache_policy=NO_CACHE, task_run_name="read-evaluations")
def read_evaluations(ex: Exchange, sites: list[str], rounds: int,
                     updates: int | None = None) -> dict[str, dict[str, Any]]:
    """:func:`evaluations` on the coordinator, naming the sites that withheld metrics (too few test rows)."""
    logger = get_run_logger()
    out = evaluations(ex, sites, rounds, updates)
    for s, models in out.items():
        held = sorted(n for n, m in models.items() if "withheld" in m)
        if held:
            logger.warning("site %s withheld its metrics of %s: %s", s, held, models[held[0]]["withheld"])
    return out


@task(cache_policy=NO_CACHE, retry_condition_fn=retry_if_transient, retries=1,
      task_run_name="validate-{ctx.site}-round-{rnd}")
def validate_round(ctx: SiteContext, rnd: int, x: np.ndarray, y: np.ndarray, norm: dict[str, Any]) -> dict[str, Any]:
    """Score global model ``rnd`` on this site's validation split; publish the metrics (never scores).

    No score histograms: a validation only feeds the round's one number and the early-stopping decision.
    """
    metrics = evaluate_weights.fn(ctx, global_weights(rnd).name, x, y, norm)
    metrics = {k: v for k, v in metrics.items() if k not in ("hist_pos", "hist_neg")}
    ctx.exchange.put_json(validation(rnd), {"site": ctx.site, "round": rnd, "metrics": metrics})
    return metrics


def read_validation(ex: Exchange, rnd: int, sites: list[str],
                    invalid: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """The validations of global model ``rnd`` that these sites published (schema-checked as read).

    A document the protocol's schema refuses is left out, with its reason in ``invalid`` (when given): one
    site's bad document does not stop the job.
    """
    out = {}
    for s in sites:
        if ex.exists(validation(rnd), writer=s):
            try:
                out[s] = ex.get_json(validation(rnd), writer=s)["metrics"]
            except ExchangeError as e:
                if invalid is not None:
                    invalid[s] = str(e)
    return out


def validation_rows(context: SiteContext) -> tuple[np.ndarray, np.ndarray] | None:
    """This site's validation split, or None when it has none (``split.val: 0``, or no rows landed there)."""
    from insitu.data.loader import load_split

    job_id = context.exchange.job_id
    try:
        x, y = load_split(context.store, context.conf.dataset_name, job_id, "val")
    except (FileNotFoundError, ValueError):
        get_run_logger().info("site %s has no validation rows for job %s: it publishes no validation", context.site,
                              job_id)
        return None
    context.audit.append("data.read", what="prepared/val", job_id=job_id, flow_run_id=context.flow_run_id,
                         rows=len(y))
    return x, y


def validator(context: SiteContext, global_stats: dict[str, Any]) -> Callable[[int], Pending] | None:
    """What starts validating global model ``r`` on this site's validation rows (:func:`validate_round`, submitted
    to the flow's task runner: a thread, while the round trains on the site's Dask workers); None when the site
    has none (:func:`validation_rows`)."""
    rows = validation_rows(context)
    if rows is None:
        return None
    x, y = rows
    return lambda rnd: validate_round.submit(context, rnd, x, y, global_stats)


def validated_rounds(ex: Exchange, rounds: int) -> list[int]:
    """The rounds of the job (0 to ``rounds``) whose validation this site published."""
    return [r for r in range(rounds + 1) if ex.exists(validation(r))]


def _binding_key(job_id: str) -> str:
    return f"evaluations/{job_id}.json"


def evaluation_binding(store: Store, job_id: str) -> str | None:
    """The global model this job's evaluation is bound to in the site's own store (None before the first)."""
    try:
        return json.loads(store.fs.cat_file(store.path(_binding_key(job_id))))["model"]  # one GET
    except FileNotFoundError:
        return None


def bind_evaluation(store: Store, job_id: str, model: str) -> None:
    """Bind this job's evaluation to ``model`` in the site's own store: the first global model it scores."""
    store.write_bytes(_binding_key(job_id), json.dumps({"model": model}).encode())
