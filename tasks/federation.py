"""The coordinator's side of a federated job: global statistics, initial weights, rounds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from insitu.conf import TrainingConfig
from insitu.data.features import feature_names
from insitu.federated.aggregators import Aggregator
from insitu.federated.claims import N_SAMPLES_RULE, SCHEMA_RULE, ClaimRefusal
from insitu.federated.codecs import UpdateEncoding
from insitu.federated.exchange import Exchange
from insitu.federated.kinds import COORDINATOR
from insitu.federated.paths import GLOBAL_STATS, PREPARE_STATS, STOP, global_weights, validation
from insitu.federated.rounds import collect, run_round, stale_updates
from insitu.federated.stats import combine, mean_std
from insitu.federated.validation import RoundValidation, Selection
from insitu.governance.audit_service import Auditor
from insitu.job import JobSpec
from insitu.models import Normalization, build_model
from insitu.specs import TaskSpec
from tasks.claims import audit_refusals, committed_counts, judged_metrics
from tasks.evaluate import read_validation


@task(cache_policy=NO_CACHE, task_run_name="global-statistics")
def publish_global_stats(ex: Exchange, conf: JobSpec, sites: list[str]) -> dict[str, Any]:
    """Combine the sites' aggregate statistics into global normalisation and the loss's parameters.

    Each site's ``prepare.json`` is checked against the protocol's schema as it is read (row floor included);
    its statistics must also have one value per feature of the dataset.
    """
    features = feature_names(conf.dataset.schema_)
    per_site = {s: ex.get_json(PREPARE_STATS, writer=s) for s in sites}
    for s, p in per_site.items():
        width = len(p["train_stats"]["sum"])
        if p["train_stats"]["n"] and width != len(features):
            raise ValueError(f"site {s} published statistics of {width} features; the dataset has {len(features)}")
    total = combine(p["train_stats"] for p in per_site.values())
    mean, std = mean_std(total)
    task = conf.task
    shift, scale = task.output_norm(total)
    norm = {"features": features, "mean": mean, "std": std, "n": total["n"], "out_shift": shift, "out_scale": scale,
            # e.g. the positive class's or each class's weight: the same loss on every site
            "loss_params": task.loss_params(total)}
    if "label_counts" in total:
        norm["label_counts"] = total["label_counts"]
    ex.put_json(GLOBAL_STATS, norm)
    return {"norm": norm, "per_site": per_site}


@task(cache_policy=NO_CACHE, task_run_name="initial-weights")
def publish_initial_weights(ex: Exchange, conf: JobSpec, norm: dict[str, Any]) -> dict[str, Any]:
    initial = global_weights(0)
    if ex.exists(initial.manifest):  # a re-run of the same job keeps its start
        return ex.get_json(initial.manifest, writer=COORDINATOR)
    torch.manual_seed(conf.training.seed)
    model = build_model(conf.training.model, len(norm["mean"]), conf.task.n_outputs, Normalization.from_global(norm))
    return ex.put_state(initial, model.state_dict(), round=0)


@task(cache_policy=NO_CACHE, task_run_name="aggregate-round-{rnd}")
def aggregate_round(
    ex: Exchange, rnd: int, sites: list[str], min_sites: int, deadline_s: float,
    is_alive: Callable[[str], bool] | None = None,
    aggregator: Aggregator | None = None,
    committed: dict[str, dict[str, int]] | None = None,
    audit: Auditor | None = None,
    flow_run_id: str | None = None,
    encoding: UpdateEncoding | None = None,
) -> dict[str, Any]:
    """Wait for the sites' updates until the deadline, check the quorum, aggregate, publish the next global.

    A site that misses the deadline is logged and skipped for this round; so is one whose update the
    protocol refuses (with the reason, in the result's ``rejected``), and one whose update claims more rows
    than its site ``committed`` (audited as ``update.refused``). A site over its byte budget on the exchange
    stops the job (ProtocolViolation).
    """
    logger = get_run_logger()
    res = run_round(ex, rnd, sites, min_sites, deadline_s, is_alive, aggregator=aggregator, committed=committed,
                    encoding=encoding)
    audit_refusals(audit, ex.job_id, flow_run_id, "update.refused", res.refused_claims, round=rnd)
    late = [s for s in res.missing if s not in res.rejected]
    if late:
        logger.warning("round %d: no update from %s within %.0fs; skipped for this round", rnd, late, deadline_s)
    for s, why in res.rejected.items():
        logger.warning("round %d: the update of %s is rejected and skipped for this round: %s", rnd, s, why)
    logger.info("round %d %s from %s (%d samples)", rnd, "already aggregated (resumed job)" if res.resumed
                else "aggregated", res.sites, res.n_samples)
    return res.as_dict()


@dataclass
class FederatedRounds:
    """The Prefect layer's :class:`~insitu.federated.coordinator.RoundDriver`: rounds as tasks, validations
    read from the exchange, every round logged to MLflow and the progress artifact."""

    ex: Exchange
    sites: list[str]
    training: TrainingConfig
    task: TaskSpec
    aggregator: Aggregator
    is_alive: Callable[[str], bool]
    record_round: Callable[[int, dict[str, Any] | None, RoundValidation | None, dict[str, dict[str, Any]]], None]
    audit: Auditor | None = None
    flow_run_id: str | None = None
    selection: Selection | None = None  # where sites whose numbers were refused or disagreed are named
    on_round: Callable[[int, dict[str, Any]], None] | None = None  # after each aggregation (alerts)
    encoding: UpdateEncoding | None = None  # the job's federation.compression, resolved once with the job
    _per_site: dict[str, dict[str, Any]] = field(default_factory=dict, init=False)  # the last validation read
    _missed: dict[int, set[str]] = field(default_factory=dict, init=False)  # rounds closed without these sites
    _committed: dict[str, dict[str, int]] | None = field(default=None, init=False)

    @property
    def committed(self) -> dict[str, dict[str, int]]:
        """Each site's rows per split from its prepare statistics (read once: they precede round 0)."""
        if self._committed is None:
            self._committed = committed_counts(self.ex, self.sites)
        return self._committed

    def aggregate(self, rnd: int) -> dict[str, Any]:
        f = self.training.federation
        result = aggregate_round(self.ex, rnd, self.sites, f.min_sites, f.round_deadline_s, self.is_alive,
                                 self.aggregator, self.committed, self.audit, self.flow_run_id, self.encoding)
        late = {s for s in result["missing"] if s not in result["rejected"]}
        if late and not result.get("resumed"):
            self._missed[rnd] = late
        self.refuse_stale()
        for site, why in result["rejected"].items():
            if N_SAMPLES_RULE in why and self.selection is not None:  # a claim, not a fault: named in the summary
                self.selection.suspect(site, why)
        if self.on_round is not None:
            self.on_round(rnd, result)
        return result

    def refuse_stale(self) -> None:
        """Audit (``update.refused``, rule ``round.stale``) each update that arrived after its round closed without
        it, once: it is not merged, and its site takes part again from the next global model on."""
        stale = stale_updates(self.ex, self._missed, self.training.federation.round_deadline_s)
        for rnd, r in stale:
            self._missed[rnd].discard(r.site)
            audit_refusals(self.audit, self.ex.job_id, self.flow_run_id, "update.refused", [r], round=rnd)

    def validation(self, rnd: int, wait: bool) -> tuple[dict[str, float], list[str]] | None:
        if wait:  # the last global model: its validations may still be on their way
            collect(self.ex, validation(rnd), self.sites, self.training.federation.round_deadline_s, self.is_alive)
            self.refuse_stale()  # the last round's late updates
        invalid: dict[str, str] = {}
        self._per_site = read_validation(self.ex, rnd, self.sites, invalid)
        for site, why in invalid.items():
            audit_refusals(self.audit, self.ex.job_id, self.flow_run_id, "metrics.refused", [ClaimRefusal(
                site, SCHEMA_RULE, f"the validation of global model {rnd}", None, None, why)])
            if self.selection is not None:
                self.selection.suspect(site, why)
        v = self.training.validation
        metric = self.task.gate_metric(v.metric or self.training.gate.primary_metric).name
        # Out-of-range documents are left out (audited); the rest combined robustly with 3 or more sites.
        judged = judged_metrics(self._per_site, self.committed, self.task, v, metric, "val",
                                f"the validation of global model {rnd}", self.audit, self.ex.job_id,
                                self.flow_run_id, self.selection)
        if not judged.sites:
            return None
        return judged.metrics, judged.sites

    def record(self, rnd: int, result: dict[str, Any] | None, validation: RoundValidation | None) -> None:
        self.record_round(rnd, result, validation, self._per_site)

    def stop(self, after_round: int, reason: str) -> None:
        self.ex.put_json(STOP, {"after_round": after_round, "reason": reason})
