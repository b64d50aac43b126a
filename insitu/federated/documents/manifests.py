"""The manifests of model states: a global model's weights, a site's update (by round, or async by sequence).

A state file (``.pt``) is checked by :mod:`insitu.federated.states`; its manifest, written last, carries its
SHA-256, size, sample count and, for an update, the site's training metrics.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from insitu.federated.documents.base import (
    MAX_ROUNDS,
    MAX_SITES,
    Doc,
    Ident,
    JobId,
    RanAs,
    Sha256,
    Site,
    StateName,
    Timestamp,
)
from insitu.federated.kinds import MAX_STATE_BYTES, MIN_ROWS


class TrainMetrics(Doc):
    """What a site reports of one round's local training (insitu.parallel.loop): a closed set of numbers."""

    train_loss: float | None = None
    steps: float | None = None
    samples_per_s: float | None = None
    step_time_s: float | None = None
    comm_s: float | None = None
    train_seconds: float | None = None
    checkpoint_s: float | None = None
    resumed_from_step: float | None = None
    global_steps: float | None = None
    ranks: float | None = None
    replicas: float | None = None  # data-parallel replicas among the ranks (a pipeline's stages share one)


class StateManifest(Doc):
    job_id: JobId
    writer: Site
    name: StateName
    sha256: Sha256
    bytes: Annotated[int, Field(gt=0, le=MAX_STATE_BYTES)]
    created: Timestamp


class AppliedUpdate(Doc):
    """One site update that went into an async global version (or sits in the parameter server's buffer)."""

    site: Site
    seq: Annotated[int, Field(ge=0, le=10**6)]
    base_version: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    staleness: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    weight: float  # FedAsync's α_t, FedBuff's s(τ)


MAX_BUFFER = 1000
AppliedList = Annotated[list[AppliedUpdate], Field(max_length=MAX_BUFFER)]


# A global model's rows: the sum of its updates' counts. Bounded by what every update (MAX_SAMPLES each) of a full
# buffer from every site could add up to, so that no site's claim can break the coordinator's own manifest.
MAX_SAMPLES = 10**15
TotalSamples = Annotated[int, Field(ge=0, le=MAX_SAMPLES * MAX_SITES * MAX_BUFFER)]


class WeightsManifest(StateManifest):
    round: Annotated[int, Field(ge=0, le=MAX_ROUNDS + 1)] | None = None
    sites: Annotated[list[Site], Field(max_length=MAX_SITES)] | None = None
    n_samples: TotalSamples | None = None
    version: Ident | None = None  # the registry version of a champion
    applied: AppliedList | None = None  # async mode: the updates this version was made of
    decisions: Annotated[int, Field(ge=0, le=10**7)] | None = None  # async buffer: after which decision

    @model_validator(mode="after")
    def _round_matches_name(self) -> WeightsManifest:
        if self.name.startswith("round-") and (self.round is None or self.name != f"round-{self.round:04d}"):
            raise ValueError(f"weights {self.name} must say round {self.name.removeprefix('round-')}")
        return self


class UpdateManifest(StateManifest):
    round: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    n_samples: Annotated[int, Field(ge=MIN_ROWS, le=MAX_SAMPLES)]  # an update from fewer rows describes them
    base_sha256: Sha256
    metrics: TrainMetrics = TrainMetrics()
    ran_as: RanAs | None = None
    encoding: Ident | None = None  # federation.compression (e.g. int8-delta); None: a full state dict

    @model_validator(mode="after")
    def _round_matches_name(self) -> UpdateManifest:
        if self.name != f"round-{self.round:04d}":
            raise ValueError(f"an update named {self.name} must be for round {self.name.removeprefix('round-')}")
        return self


class AsyncUpdateManifest(StateManifest):
    """A site's update in an async job: its sequence number and the global version it trained from."""

    seq: Annotated[int, Field(ge=0, le=10**6)]
    base_version: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    n_samples: Annotated[int, Field(ge=MIN_ROWS, le=MAX_SAMPLES)]  # an update from fewer rows describes them
    base_sha256: Sha256
    metrics: TrainMetrics = TrainMetrics()
    ran_as: RanAs | None = None
    encoding: Ident | None = None  # federation.compression (e.g. int8-delta); None: a full state dict

    @model_validator(mode="after")
    def _seq_matches_name(self) -> AsyncUpdateManifest:
        if self.name != f"async-{self.seq:06d}":
            raise ValueError(f"an update named {self.name} must have seq {self.name.removeprefix('async-')}")
        return self
