"""The documents of a job's start: the coordinator's plan and the statistics both sides publish.

A site publishes counts and the sums of its train split (``stats/prepare.json``), never values; the
coordinator publishes the global normalisation and class balance it combined from them (``stats/global.json``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from insitu.conf import TrainingConfig
from insitu.federated.documents.base import (
    MAX_CLASSES,
    MAX_FEATURES,
    MAX_SHARDS,
    MAX_SITES,
    Count,
    Doc,
    Error,
    Feature,
    FlowRunId,
    Hash,
    Ident,
    JobId,
    Location,
    MetricName,
    RanAs,
    Site,
    Split,
    Vector,
)
from insitu.federated.kinds import MIN_ROWS


class Plan(Doc):
    job_id: JobId
    dataset: Ident
    shards: Annotated[dict[Site, Annotated[list[Ident], Field(max_length=MAX_SHARDS)]], Field(max_length=MAX_SITES)]
    config_hash: Hash
    training: TrainingConfig


ClassCounts = Annotated[list[Count], Field(min_length=2, max_length=MAX_CLASSES)]


class TrainStats(Doc):
    """A train split's sums; the label's part is its count per class, or its sum and sum of squares."""

    n: Count
    sum: Vector
    sumsq: Vector
    label_counts: ClassCounts | None = None
    label_sum: float | None = None
    label_sumsq: float | None = None

    @model_validator(mode="after")
    def _floor(self) -> TrainStats:
        if 0 < self.n < MIN_ROWS:
            raise ValueError(f"statistics over {self.n} rows; the floor is {MIN_ROWS}")
        if len(self.sum) != len(self.sumsq):
            raise ValueError("sum and sumsq differ in length")
        if self.label_counts is not None and sum(self.label_counts) != self.n:
            raise ValueError("the class counts do not add up to n")
        if (self.label_sum is None) != (self.label_sumsq is None):
            raise ValueError("label_sum and label_sumsq come together")
        return self


class ShardSummary(Doc):
    rows_read: Count
    rows_prepared: Count
    rows_quarantined: Count
    split_counts: dict[Split, Count]
    error: Error | None = None
    quarantine_path: Location | None = None


class PrepareStats(Doc):
    """``stats/prepare.json`` of a site: counts and the sums of its train split, never values."""

    site: Site
    ran_as: RanAs
    shards: Annotated[dict[Ident, ShardSummary], Field(max_length=MAX_SHARDS)]
    rows_read: Count
    rows_prepared: Count
    rows_quarantined: Count
    shards_unreadable: Annotated[list[Ident], Field(max_length=MAX_SHARDS)]
    split_counts: dict[Split, Count]
    train_stats: TrainStats
    raw_bytes: Count
    flow_run_id: FlowRunId | None = None  # the site's run that prepared: the coordinator counts its own runs' only


class GlobalStats(Doc):
    """``stats/global.json`` of the coordinator: global normalisation and class balance."""

    features: Annotated[list[Feature], Field(max_length=MAX_FEATURES)]
    mean: Vector
    std: Vector
    n: Count
    label_counts: ClassCounts | None = None
    out_shift: float = 0.0  # the label's mean (regression), else 0
    out_scale: float = 1.0  # the label's standard deviation (regression), else 1
    loss_params: Annotated[dict[MetricName, float | Annotated[list[float], Field(max_length=MAX_CLASSES)]],
                           Field(max_length=8)]

    @model_validator(mode="after")
    def _widths(self) -> GlobalStats:
        if not len(self.features) == len(self.mean) == len(self.std):
            raise ValueError("features, mean and std differ in length")
        return self
