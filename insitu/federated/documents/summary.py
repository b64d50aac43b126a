"""``summary/summary.json``: what the coordinator reports of a job (:func:`insitu.summary.job_summary`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from insitu.federated.documents.base import (
    MAX_ROUNDS,
    MAX_SHARDS,
    MAX_SITES,
    Count,
    Doc,
    Hash,
    Ident,
    JobId,
    Label,
    MetricName,
    Metrics,
    RanAs,
    Site,
    Split,
    Text,
    Timestamp,
)

# The metrics a summary written before tasks named their metrics shows (a binary task's).
BINARY_METRIC_NAMES = ("roc_auc", "pr_auc", "loss")


class RoundDetail(Doc):
    round: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    sites: Annotated[list[Site], Field(max_length=MAX_SITES)]
    missing: Annotated[list[Site], Field(max_length=MAX_SITES)]
    rejected: Annotated[dict[Site, Text], Field(max_length=MAX_SITES)] = {}  # why a site's update was not used
    # the round's wall time as the coordinator waited for it (None: reused from an earlier run of the job, or async)
    seconds: Annotated[float, Field(ge=0, le=7 * 24 * 3600)] | None = None


class SiteSummary(Doc):
    rows_read: Count
    rows_prepared: Count
    rows_quarantined: Count
    shards_unreadable: Annotated[list[Ident], Field(max_length=MAX_SHARDS)]
    split_counts: dict[Split, Count]
    raw_bytes: Count
    rounds_contributed: Count
    metrics: Metrics
    bytes_to_exchange: Annotated[dict[Label, Count], Field(max_length=32)]


class GateRecord(Doc):
    passed: bool
    reason: Text
    primary_metric: MetricName
    candidate: float | Metrics | None = None  # a re-judged version reports the candidate's global metrics
    champion: Ident | float | None = None
    site_deltas: Annotated[dict[Site, float], Field(max_length=MAX_SITES)] = {}
    version: Ident | None = None
    previous_champion: Ident | None = None


class Registration(Doc):
    model_name: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    version: Ident
    alias: Literal["champion", "challenger"]
    run_id: Ident
    gate: GateRecord | None = None


class ValidationPoint(Doc):
    round: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    value: float
    sites: Annotated[list[Site], Field(max_length=MAX_SITES)]


class AlertRecord(Doc):
    """A paused pool or a forced site run seen during the job (:mod:`insitu.governance.run_alerts`); a site dropped
    from a round, a slow round, a gate refusal (:mod:`insitu.federated.round_alerts`)."""

    kind: Literal["pool-paused", "run-forced", "run-cancelled", "site-dropped", "slow-round", "gate-refused"]
    site: Site | Literal[""]  # "": the whole job (a gate refusal)
    phase: Literal["prepare", "train", "evaluate", "gate"]
    detail: Text
    pool: Ident | None = None
    flow_run_id: Ident | None = None


class Summary(Doc):
    """``summary/summary.json``: :func:`insitu.summary.job_summary`."""

    job_id: JobId
    dataset: Ident
    config_hash: Hash
    rounds: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    rounds_detail: Annotated[list[RoundDetail], Field(max_length=MAX_ROUNDS)]
    sites: Annotated[dict[Site, SiteSummary], Field(max_length=MAX_SITES)]
    global_metrics: Metrics
    bytes_crossed: Count
    bytes_crossed_by_writer: Annotated[dict[Site, Annotated[dict[Label, Count], Field(max_length=32)]],
                                       Field(max_length=MAX_SITES + 1)]
    raw_bytes: Count
    model: Registration
    ran_as: Annotated[dict[Site, Annotated[dict[Label, RanAs | None], Field(max_length=8)]],
                      Field(max_length=MAX_SITES + 1)]
    started: Timestamp
    finished: Timestamp
    withheld: Annotated[dict[Label, Annotated[list[Site], Field(max_length=MAX_SITES)]], Field(max_length=4)] = {}
    task: MetricName = "binary"
    selected_round: Annotated[int, Field(ge=0, le=MAX_ROUNDS)] | None = None
    selection: Text = ""
    stopped_early: bool = False
    validation: Annotated[list[ValidationPoint], Field(max_length=MAX_ROUNDS + 1)] = []
    metric_names: Annotated[list[MetricName], Field(max_length=8)] = list(BINARY_METRIC_NAMES)
    # site -> why its reported numbers were refused or disagreed with the others' (insitu.federated.consensus)
    suspects: Annotated[dict[Site, Annotated[list[Text], Field(max_length=8)]], Field(max_length=MAX_SITES)] = {}
    alerts: Annotated[list[AlertRecord], Field(max_length=4 * MAX_SITES)] = []
