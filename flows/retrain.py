"""``retrain``: the coordinator's story of one federated job.

plan → prepare on every site's pool → federated rounds → evaluate on every site → register.
The coordinator sees aggregate statistics, model weights and metrics; never a row.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import cached_property
from typing import Any
from uuid import UUID

import mlflow
from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact

from flows.forms import RetrainParams
from insitu.conf import TrainingConfig, load_alerts, trusted_training
from insitu.federated.aggregators import build_aggregator
from insitu.federated.asynchronous import update_limit
from insitu.federated.coordinator import RoundsOutcome, run_rounds
from insitu.federated.deadlines import missed_deadline
from insitu.federated.exchange import Exchange
from insitu.federated.integrity import aggregated_sha256, registration_refusal
from insitu.federated.kinds import COORDINATOR, MAX_UPDATE_NORM
from insitu.federated.paths import ABORT, CHAMPION, GLOBAL_STATS, PLAN, PREPARE_STATS, SUMMARY, global_weights
from insitu.federated.plan import resume_refusal, shard_plan, sites_prepared_before
from insitu.federated.quorum import quorum_refusal
from insitu.federated.site_rounds import site_wait_timeout_s
from insitu.federated.validation import RoundValidation, Selection
from insitu.gate import Promotion
from insitu.governance.audit_service import Auditor
from insitu.governance.identity import Identity
from insitu.governance.request import SignedRequest
from insitu.job import JobSpec, load_job
from insitu.storage import store_from_env
from insitu.summary import collect_identities, job_summary, summary_markdown, withheld_by_floor
from tasks.alerts import RunWatch
from tasks.anchoring import countersign
from tasks.claims import judge_evaluations
from tasks.context import actor_identity, ran_as
from tasks.dispatch import (
    aborted_on_failure,
    dispatch_phase,
    dispatch_phase_and_wait,
    explained,
    leave_out_late,
    run_states,
    start_site_runs,
    wait_until_published,
)
from tasks.evaluate import read_evaluations
from tasks.federation import FederatedRounds, publish_global_stats, publish_initial_weights
from tasks.federation_async import run_async
from tasks.figures import log_figures
from tasks.job_lease import one_run_per_job, stop_earlier_site_runs
from tasks.job_request import job_request
from tasks.mlflow_runs import (
    finish_runs,
    log_async_version,
    log_phase_time,
    log_round,
    log_validation,
    logged_rounds,
    start_runs,
)
from tasks.promotion import gate_and_promote
from tasks.registration import Champion, Registration, load_champion, register_model


@dataclass
class Job:
    """What every phase of one ``retrain`` run shares: the job, its configuration, its request, the exchange."""

    params: RetrainParams
    job_id: str
    started: datetime
    overrides: dict[str, Any]
    conf: JobSpec
    identity: Identity  # the coordinator's, from its worker's own identity file
    flow_run_id: str | None
    audit: Auditor
    signed: SignedRequest
    exchange: Exchange

    @property
    def training(self) -> TrainingConfig:
        return self.conf.training

    @property
    def pools(self) -> dict[str, str]:
        return {s: self.conf.sites.site(s).work_pool for s in self.conf.sites.names}

    @cached_property
    def watch(self) -> RunWatch:
        """Paused pools and forced site runs of this job, audited and alerted while it waits for its sites."""
        return RunWatch(self.audit, self.job_id, self.flow_run_id, self.pools, self.exchange)

    @property
    def common(self) -> dict[str, Any]:
        """The parameters of every site flow run of this job."""
        return {"job_id": self.job_id, "dataset": self.conf.dataset_name, "training": self.params.training,
                "overrides": self.overrides or None, "request": self.signed.model_dump(mode="json")}


@dataclass
class Evaluated:
    """The sites' test metrics of the selected model (and of the champion, if there is one)."""

    sites: list[str]
    raw: dict[str, dict[str, Any]]
    site_metrics: dict[str, dict[str, float]]
    global_metrics: dict[str, float]
    champion: Champion | None
    champion_sites: dict[str, dict[str, float]] | None
    champion_global: dict[str, float] | None
    distrusted: list[str]  # sites whose test metrics disagree with the others': left out of the per-site drop

    def for_gate(self, per_site: dict[str, dict[str, float]] | None) -> dict[str, dict[str, float]] | None:
        return None if per_site is None else {s: m for s, m in per_site.items() if s not in self.distrusted}


@flow(name="retrain", log_prints=False)
def retrain(params: RetrainParams = RetrainParams()) -> dict[str, Any]:  # noqa: B008 (Prefect builds the form)
    job = open_job(params)
    with one_run_per_job(job.job_id, job.flow_run_id, job.audit):  # a second run of the job is refused at once
        stop_earlier_site_runs(job.job_id, job.flow_run_id, job.audit)  # an earlier run that died left them going
        plan = plan_job(job)
        job.exchange.delete(ABORT)  # a re-run of an aborted job starts clean (the marker stops the sites' runs)
        with aborted_on_failure(job.exchange):  # a site's run waiting to be dispatched its next phase stops at once
            sites, prepare_runs = prepare(job, plan)
            stats = publish_global_stats(job.exchange, job.conf, sites)
            publish_initial_weights(job.exchange, job.conf, stats["norm"])
            mlruns = start_runs(job.conf, job.job_id, sites, job.flow_run_id)
            # System metrics (CPU, memory) of the coordinator are recorded on the parent run while it is active.
            with mlflow.start_run(run_id=mlruns["parent"], log_system_metrics=True):
                outcome, train_runs = train(job, sites, mlruns, prepare_runs)
                evaluated = evaluate(job, sites, outcome, stats["norm"]["features"], train_runs)
                registration = register(job, mlruns, outcome, evaluated, stats["norm"], sites)
        promotion = gate_and_promote(job.conf, job.job_id, registration.version, evaluated.global_metrics,
                                     evaluated.for_gate(evaluated.site_metrics), evaluated.champion,
                                     evaluated.champion_global, evaluated.for_gate(evaluated.champion_sites))
        if not promotion.passed and promotion.basis != "judged":  # judged: by an earlier run of the job
            job.watch.gate_refused(registration.model_name, registration.version, promotion.reason)
        return finish(job, mlruns, registration, promotion, sites, stats, outcome, evaluated)


def open_job(params: RetrainParams) -> Job:
    """The job's id, configuration (overrides applied), the coordinator's identity and the signed request."""
    started = datetime.now(UTC)
    job_id = params.job_id or f"{started:%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
    overrides = {k: v for k, v in {"rounds": params.rounds, "local_epochs": params.local_epochs,
                                    "batch_size": params.batch_size}.items() if v is not None}
    conf = load_job(trusted_training(params.training), params.dataset, overrides=overrides or None)
    identity, flow_run_id = actor_identity("coordinator", job_id)
    audit = identity.audit()
    signed = job_request(params.request, params.training, params.dataset, job_id, overrides, audit, flow_run_id)
    exchange = Exchange(store_from_env(conf.sites.exchange, "exchange"), job_id, writer=COORDINATOR)
    return Job(params, job_id, started, overrides, conf, identity, flow_run_id, audit, signed, exchange)


def plan_job(job: Job) -> dict[str, list[str]]:
    """Map each shard to the site it is pinned to; publish the plan (a re-run resumes only under the same
    configuration); audit it; show it as an artifact."""
    conf, exchange = job.conf, job.exchange
    plan = shard_plan(conf)
    before = exchange.get_json(PLAN) if exchange.exists(PLAN) else None  # a re-run of this job resumes it …
    refusal = resume_refusal(before, conf.config_hash, job.job_id, job.params.training, job.overrides)
    if refusal:  # … only under the same configuration
        raise ValueError(refusal)
    if before is not None:
        get_run_logger().info("job %s exists: resuming it (finished rounds are reused)", job.job_id)
    exchange.put_json(PLAN, {"job_id": job.job_id, "dataset": conf.dataset_name, "shards": plan,
                             "config_hash": conf.config_hash, "training": job.training.model_dump(mode="json")})
    request = job.signed.request
    job.audit.append("job.planned", job_id=job.job_id, flow_run_id=job.flow_run_id, shards=plan,
                     config_hash=conf.config_hash, claimed_principal=request.principal, purpose=request.purpose,
                     request=job.signed.digest(), standing=request.standing)
    create_markdown_artifact(
        key="retrain-plan",
        markdown="## Plan for job `" + job.job_id + "`\n\n"
        f"Requested by `{request.principal}` (each site verifies the signature) for *{request.purpose}* "
        f"({'standing approval' if request.standing else 'signed job request'}, "
        f"request `{job.signed.digest()[:12]}`); "
        "each site decides it with its own policy.\n\n"
        "| site | pool | shards |\n|---|---|---|\n" + "\n".join(
            f"| {site} | {conf.sites.site(site).work_pool} | {', '.join(shard_ids)} |"
            for site, shard_ids in plan.items()),
        description=f"insitu plan {job.job_id}",
    )
    return plan


def prepare(job: Job, plan: dict[str, list[str]]) -> tuple[list[str], dict[str, UUID]]:
    """``site-prepare`` on every site's pool in parallel (or the job's earlier preparation); the sites that
    prepared, at least the quorum, and their runs (which go on to train when :func:`train` dispatches it)."""
    reused = sites_prepared_before(job.exchange.exists(GLOBAL_STATS),
                                   {site: job.exchange.exists(PREPARE_STATS, writer=site) for site in plan})
    if reused is not None:
        get_run_logger().info("job %s was prepared before on %s; reusing that preparation", job.job_id, reused)
        return reused, {}
    # No shards: each site reads every shard its own datasets.yaml pins to it for the signed dataset.
    run_ids = start_site_runs("site-prepare", {site: dict(job.common) for site in plan}, job.pools, job.exchange,
                              goes_on=True)  # each site's one run of the job: it trains and evaluates too
    # A shard that stalls a site's preparation must not stall the job: past the deadline the site is left out.
    deadline = min(job.params.phase_timeout_s, job.training.federation.prepare_deadline_s)
    # A site whose run published its preparation is done with it: the run waits, still going, for its training.
    runs, prepared = wait_until_published(run_ids, job.exchange, PREPARE_STATS, deadline, job.watch.on("prepare"))
    late = missed_deadline({s: s in prepared or bool(r.state and r.state.is_final()) for s, r in runs.items()},
                           deadline, "prepare", "federation.prepare_deadline_s")
    job.watch.excuse(run_ids[site] for site in late)  # cancelled by the coordinator, not forced by someone else
    failures = leave_out_late(run_ids, {s: r for s, r in runs.items() if s not in prepared}, late)
    failures.update({s: "its run ended without publishing its preparation" for s in plan
                     if s not in prepared and s not in failures})
    sites = [site for site in plan if site not in failures]
    require_quorum(job, "prepare", sites, failures)
    if failures:
        get_run_logger().warning("prepare: going on without %s", failures)
        job.audit.append("job.sites_left_out", job_id=job.job_id, phase="prepare", failed_sites=failures)
    return sites, {site: run_ids[site] for site in sites}


def train(job: Job, sites: list[str], mlruns: dict[str, str],
          prepare_runs: dict[str, UUID]) -> tuple[RoundsOutcome, dict[str, UUID]]:
    """Each site's one run of the job trains (a ``site-train`` run only where it ended); the rounds
    (insitu.federated.coordinator.run_rounds) exchange through the exchange; each round logged to MLflow and the
    progress artifact; the selected round audited.
    Returns the outcome and the site runs, which go on to evaluate the job (:func:`evaluate`)."""
    logger, training, exchange = get_run_logger(), job.training, job.exchange
    progress = create_progress_artifact(progress=0.0, key="retrain-progress",
                                        description=f"federated rounds of job {job.job_id}")
    # When the phase started and when its last global model was made: the wall time of the job's updates,
    # which is what sync and async mode are compared by (bench/async_vs_sync.py, tests/e2e/test_async.py).
    marks = {"start": time.monotonic()}
    wait_s = site_wait_timeout_s(training.federation.round_deadline_s)
    # In each site's prepare run where it is still going (one flow run per site per job), else in a new run.
    run_ids = dispatch_phase("site-train", {site: {**job.common, "wait_timeout_s": wait_s} for site in sites},
                             prepare_runs, job.pools, job.exchange, goes_on=True)

    def alive(site: str) -> bool:
        state = run_states({site: run_ids[site]})[site].state
        return not (state and state.is_final())

    logged = logged_rounds(mlruns)
    learning_task = job.conf.task
    selection = Selection(learning_task.gate_metric(training.validation.metric or training.gate.primary_metric),
                          training.validation)

    def record(rnd: int, result: dict[str, Any] | None, validation: RoundValidation | None,
               validation_by_site: dict[str, dict[str, Any]]) -> None:
        if result is not None:
            log_round(mlruns, rnd, result, logged)  # once per round and run, whichever attempt gets there
            update_progress_artifact(progress, progress=100.0 * (rnd + 1) / training.rounds)
            marks["updates_done"] = time.monotonic()
        if validation is not None:
            log_validation(mlruns, rnd, validation, validation_by_site, logged)
            logger.info("global model %d: validation %s %.4f (from %s)", rnd, selection.metric.name,
                        validation.value, validation.sites)

    def record_version(result: dict[str, Any]) -> None:  # async mode: one applied global version
        log_async_version(mlruns, result, logged)
        update_progress_artifact(progress, progress=100.0 * (result["round"] + 1) / training.rounds)
        marks["updates_done"] = time.monotonic()

    def record_validation(version: int, validation: RoundValidation,
                          validation_by_site: dict[str, dict[str, Any]]) -> None:
        record(version, None, validation, validation_by_site)

    try:
        if training.federation.mode == "async":
            outcome = run_async(exchange, sites, training, learning_task, selection, alive, job.audit,
                                job.flow_run_id, record_version, record_validation, job.conf.encoding)
        else:
            aggregator = build_aggregator(training.aggregator.name, training.aggregator.options,
                                          max_update_norm=MAX_UPDATE_NORM)
            factor, deadline = load_alerts().slow_round_factor, training.federation.round_deadline_s
            rounds = FederatedRounds(exchange, sites, training, learning_task, aggregator, alive, record, job.audit,
                                     job.flow_run_id, selection,
                                     lambda rnd, res: job.watch.round_done(rnd, res, deadline, factor),
                                     job.conf.encoding)
            job.watch.training_starts()
            outcome = run_rounds(rounds, training.rounds, selection)
    except Exception as e:
        reason, error = explained(e, run_ids)  # with why each site whose run ended did
        # Tell the sites to stop waiting for weights that will not come, and free their workers.
        exchange.put_abort(f"{type(e).__name__}: {reason}")
        job.audit.append("job.failed", job_id=job.job_id, phase="train", reason=reason)
        if error is not e:
            raise error from e
        raise
    job.watch.check("train", run_states(run_ids))  # a run that ended during the rounds: forced, or cancelled?
    if "updates_done" in marks:
        wall = marks["updates_done"] - marks["start"]
        log_phase_time(mlruns["parent"], "updates_wall_s", wall)
        logger.info("%s mode: %d global model(s) made in %.1fs", training.federation.mode, outcome.last, wall)
    logger.info("registering global model %d of %d: %s", outcome.selected, outcome.last, outcome.reason)
    job.audit.append("job.selected", job_id=job.job_id, flow_run_id=job.flow_run_id, round=outcome.selected,
                     last=outcome.last, reason=outcome.reason, stopped_early=outcome.stopped_early)
    return outcome, run_ids


def evaluate(job: Job, sites: list[str], outcome: RoundsOutcome, features: list[str],
             train_runs: dict[str, UUID]) -> Evaluated:
    """Every site scores the selected model and the current champion on its own test split, in its ``site-train``
    run when that is still going (else in a ``site-evaluate`` run); the learning task combines the sites'
    metrics."""
    training, exchange = job.training, job.exchange
    champion = load_champion(job.conf, features)
    final = global_weights(outcome.selected).name  # as the sites' evaluations name it
    names = [final]
    if champion:
        exchange.put_state(CHAMPION, champion.state, version=champion.version)
        names.append(CHAMPION.name)
    failures = dispatch_phase_and_wait("site-evaluate", {site: {**job.common, "weights": names} for site in sites},
                                       train_runs, job.pools, job.exchange, job.params.phase_timeout_s,
                                       job.watch.on("evaluate"))
    evaluated_sites = [site for site in sites if site not in failures]
    require_quorum(job, "evaluate", evaluated_sites, failures)
    by_site = read_evaluations(exchange, evaluated_sites, training.rounds, update_limit(training))
    # Each model's test metrics checked against their ranges and the sites' committed test rows, and combined
    # robustly with 3 or more sites; the gate's per-site drop leaves out sites that disagree with the others.
    judge = judge_evaluations(exchange, by_site, job.conf, outcome.selection, job.audit, job.flow_run_id)
    candidate, cand = judge(final)
    champion_by_site, champ = judge(CHAMPION.name) if champion else ({}, None)
    return Evaluated(
        sites=evaluated_sites, raw=candidate,
        site_metrics={site: _numbers(metrics) for site, metrics in candidate.items()},
        global_metrics=cand.metrics,
        champion=champion,
        champion_sites={site: _numbers(m) for site, m in champion_by_site.items()} if champ else None,
        champion_global=champ.metrics if champ else None,
        distrusted=sorted({*cand.disagreeing, *(champ.disagreeing if champ else {})}))


def register(job: Job, mlruns: dict[str, str], outcome: RoundsOutcome, evaluated: Evaluated, norm: dict[str, Any],
             sites: list[str]) -> Registration:
    """Register the selected model (checked to be the one this coordinator aggregated) with its metrics and
    lineage; log the figures."""
    selected = global_weights(outcome.selected)
    state, manifest = job.exchange.get_state(selected, writer=COORDINATOR)
    refusal = registration_refusal(selected.name, manifest["sha256"],
                                   aggregated_sha256(outcome.results, outcome.selected))
    if refusal:
        raise RuntimeError(refusal)
    registration = register_model(job.conf, job.job_id, mlruns, state, norm, evaluated.site_metrics,
                         evaluated.global_metrics, sites,
                         selection={"round": outcome.selected, "of": outcome.last, "reason": outcome.reason,
                                    "metric": outcome.selection.metric.name})
    log_figures(mlruns["parent"], evaluated.raw, evaluated.site_metrics, list(job.conf.task.summary_metrics))
    return registration


def finish(job: Job, mlruns: dict[str, str], registration: Registration, promotion: Promotion, sites: list[str],
           stats: dict[str, Any], outcome: RoundsOutcome, evaluated: Evaluated) -> dict[str, Any]:
    """Close the MLflow runs, audit the registration and the gate, countersign the sites' audit heads, and
    publish the job's summary."""
    logger, training = get_run_logger(), job.training
    finish_runs(mlruns, promotion)
    job.audit.append("model.registered", job_id=job.job_id, flow_run_id=job.flow_run_id, **registration.as_dict())
    job.audit.append("model.gate", job_id=job.job_id, flow_run_id=job.flow_run_id, model=registration.model_name,
                     version=registration.version, passed=promotion.passed, reason=promotion.reason,
                     champion=promotion.champion, previous_champion=promotion.previous_champion)
    registration = replace(registration, alias=promotion.alias)  # where the gate left it
    countersign(job.audit, job.exchange.store, sites, job.job_id)
    identities = collect_identities(job.exchange, ran_as(job.identity), sites, evaluated.sites, training.rounds)
    withheld = withheld_by_floor({s: {"model": m} for s, m in evaluated.raw.items()}, "model")
    for what, left_out in withheld.items():
        if left_out:
            logger.warning("the row floor left %s out of the %s", left_out, what)
    summary = job_summary(job.job_id, job.conf, stats["per_site"], outcome.results, evaluated.site_metrics,
                          evaluated.global_metrics, {**registration.as_dict(), "gate": promotion.as_record()},
                          job.exchange.ledger(), job.started, identities, withheld,
                          selection=outcome, alerts=[a.as_record() for a in job.watch.alerts])
    job.exchange.put_json(SUMMARY, summary)
    create_markdown_artifact(key="retrain-summary", markdown=summary_markdown(summary),
                             description=f"insitu job {job.job_id}")
    primary = job.conf.task.gate_metric(training.gate.primary_metric).name
    logger.info("job %s done: %s v%s (%s), global %s %.4f; gate: %s", job.job_id, registration.model_name,
                registration.version, registration.alias, primary, evaluated.global_metrics.get(primary, float("nan")),
                promotion.reason)
    return summary


def require_quorum(job: Job, phase: str, succeeded: list[str], failures: dict[str, str]) -> None:
    """Stop the job (audited) when fewer sites than ``federation.min_sites`` succeeded in ``phase``."""
    refusal = quorum_refusal(phase, succeeded, failures, job.training.federation.min_sites)
    if refusal:
        job.audit.append("job.failed", job_id=job.job_id, phase=phase, failed_sites=failures)
        raise RuntimeError(refusal)


def _numbers(m: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in m.items() if isinstance(v, int | float)}
