"""The exchange protocol: every artefact a party may write, by kind and name, with its schema and size.

An artefact that is not in :data:`ARTEFACTS` may not be written, and is not read. Every JSON document is
checked against its schema when written (by the writer, to fail early) and again when read (by the reader,
which trusts nobody's checks but its own). Schemas forbid unknown keys, bound every string, list and
mapping, and type every value, so that no row fits in them: no free-form lists of records, no columns, no
long strings; a state file (``.pt``) is checked by :mod:`insitu.federated.states` instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    ValidationError,
    model_validator,
)

from insitu.conf import SITE_NAME, TrainingConfig
from insitu.federated.kinds import (
    COORDINATOR,
    KIB,
    MAX_MANIFEST_BYTES,
    MAX_STATE_BYTES,
    MIB,
    MIN_ROWS,
    VALIDATION_BYTES,
    ExchangeError,
    shown,
)

MAX_SITES = 64
MAX_SHARDS = 256
MAX_FEATURES = 1024
MAX_BINS = 1000
MAX_CLASSES = 100
MAX_ROUNDS = 10_000
MAX_TEXT = 2000


Site = Annotated[str, StringConstraints(pattern=SITE_NAME)]  # the coordinator's name fits it too
JobId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")]
Ident = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,100}$")]  # shard ids, pools, users, versions
# round-N: a global model (or a site's update); champion: the registry's; aggregator-round-N: what the aggregator
# keeps after producing round N's global model (e.g. FedAdam's moments), for a resumed job to continue from.
# async-N: a site's N-th update of an async job; async-buffer-N: the parameter server's buffer after decision N.
StateName = Annotated[str, StringConstraints(
    pattern=r"^(round-\d{4,5}|champion|aggregator-round-\d{4,5}|async-\d{6,7}|async-buffer-\d{6,7})$")]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Hash = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{8,64}$")]
Timestamp = Annotated[str, StringConstraints(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?(Z|[+-]\d\d:\d\d)?$")]
MetricName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,39}$")]
Feature = Annotated[str, StringConstraints(pattern=r"^[^\x00-\x1f]{1,100}$")]
Split = Literal["train", "val", "test"]
Count = Annotated[int, Field(ge=0, le=10**15)]
Vector = Annotated[list[float], Field(max_length=MAX_FEATURES)]
Text = Annotated[str, StringConstraints(max_length=MAX_TEXT)]
Error = Annotated[str, StringConstraints(max_length=500)]  # an error message about a shard
Location = Annotated[str, StringConstraints(max_length=1000)]  # a place in the site's own store
Label = Annotated[str, StringConstraints(min_length=1, max_length=100)]  # a ledger kind, a summary step
Metrics = Annotated[dict[MetricName, float], Field(max_length=32)]


class Doc(BaseModel):
    """Base of every document: unknown keys are refused, values are not coerced (no "1" for 1)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class RanAs(Doc):
    actor: Site
    os_user: Ident
    pool: Ident


# ------------------------------------------------------------------ plan (coordinator)
class Plan(Doc):
    job_id: JobId
    dataset: Ident
    shards: Annotated[dict[Site, Annotated[list[Ident], Field(max_length=MAX_SHARDS)]], Field(max_length=MAX_SITES)]
    config_hash: Hash
    training: TrainingConfig


# ------------------------------------------------------------------ stats
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


# ------------------------------------------------------------------ weights and updates (manifests)
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


class WeightsManifest(StateManifest):
    round: Annotated[int, Field(ge=0, le=MAX_ROUNDS + 1)] | None = None
    sites: Annotated[list[Site], Field(max_length=MAX_SITES)] | None = None
    n_samples: Count | None = None
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
    n_samples: Annotated[int, Field(ge=MIN_ROWS, le=10**15)]  # an update from fewer rows describes them
    base_sha256: Sha256
    metrics: TrainMetrics = TrainMetrics()
    ran_as: RanAs | None = None

    @model_validator(mode="after")
    def _round_matches_name(self) -> UpdateManifest:
        if self.name != f"round-{self.round:04d}":
            raise ValueError(f"an update named {self.name} must be for round {self.name.removeprefix('round-')}")
        return self


class AsyncUpdateManifest(StateManifest):
    """A site's update in an async job: its sequence number and the global version it trained from."""

    seq: Annotated[int, Field(ge=0, le=10**6)]
    base_version: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    n_samples: Annotated[int, Field(ge=MIN_ROWS, le=10**15)]  # an update from fewer rows describes them
    base_sha256: Sha256
    metrics: TrainMetrics = TrainMetrics()
    ran_as: RanAs | None = None

    @model_validator(mode="after")
    def _seq_matches_name(self) -> AsyncUpdateManifest:
        if self.name != f"async-{self.seq:06d}":
            raise ValueError(f"an update named {self.name} must have seq {self.name.removeprefix('async-')}")
        return self


# ------------------------------------------------------------------ metrics (sites)
class BinaryMetrics(Doc):
    """One model's metrics on a site's test split (binary task), over at least the floor of rows.

    ``hist_pos``/``hist_neg`` count the scores of each class per bin of a fixed grid; they are coarsened
    before publication (:func:`insitu.metrics.floor_histograms`) so that no non-empty bin holds fewer rows
    than the floor.
    """

    task: Literal["binary"] = "binary"
    roc_auc: float
    pr_auc: float
    loss: float
    count: Annotated[float, Field(ge=MIN_ROWS)]
    positive_rate: float
    hist_pos: Annotated[list[Count], Field(min_length=1, max_length=MAX_BINS)] | None = None
    hist_neg: Annotated[list[Count], Field(min_length=1, max_length=MAX_BINS)] | None = None

    @model_validator(mode="after")
    def _histograms(self) -> BinaryMetrics:
        pos, neg = self.hist_pos, self.hist_neg
        if pos is None and neg is None:
            return self
        if pos is None or neg is None or len(pos) != len(neg):
            raise ValueError("hist_pos and hist_neg come together, with the same bins")
        if any(0 < c < MIN_ROWS for c in (*pos, *neg)):
            raise ValueError(f"a histogram bin holds fewer than {MIN_ROWS} rows")
        if sum(pos) + sum(neg) > self.count:
            raise ValueError("the histograms count more rows than the metrics")
        return self


class MulticlassMetrics(Doc):
    """One model's metrics on a site's split (multi-class task): counts of true × predicted class."""

    task: Literal["multiclass"]
    accuracy: float
    macro_f1: float
    log_loss: float
    loss: float
    count: Annotated[float, Field(ge=MIN_ROWS)]
    confusion: Annotated[list[Annotated[list[Count], Field(max_length=MAX_CLASSES)]], Field(min_length=2,
                                                                                          max_length=MAX_CLASSES)]

    @model_validator(mode="after")
    def _square(self) -> MulticlassMetrics:
        k = len(self.confusion)
        if any(len(row) != k for row in self.confusion):
            raise ValueError("the confusion matrix is not square")
        if sum(map(sum, self.confusion)) != self.count:
            raise ValueError("the confusion matrix does not count the split's rows")
        return self


class RegressionMetrics(Doc):
    """One model's metrics on a site's split (regression task), with the sums they combine from."""

    task: Literal["regression"]
    rmse: float
    mae: float
    r2: float
    loss: float
    count: Annotated[float, Field(ge=MIN_ROWS)]
    sse: Annotated[float, Field(ge=0.0)]
    sae: Annotated[float, Field(ge=0.0)]
    label_sum: float
    label_sumsq: Annotated[float, Field(ge=0.0)]


ModelMetrics = BinaryMetrics | MulticlassMetrics | RegressionMetrics


class Withheld(Doc):
    """Published instead of a model's metrics when the split is under the floor."""

    withheld: Label


def _metrics_or_withheld(v: object) -> str:
    # Chosen by the key that tells them apart, so that a refusal explains the one schema that applies.
    if not isinstance(v, dict) or "withheld" in v:
        return "withheld"
    return str(v.get("task", "binary"))


MetricsOrWithheld = Annotated[
    Annotated[BinaryMetrics, Tag("binary")] | Annotated[MulticlassMetrics, Tag("multiclass")]
    | Annotated[RegressionMetrics, Tag("regression")] | Annotated[Withheld, Tag("withheld")],
    Discriminator(_metrics_or_withheld),
]


class Evaluation(Doc):
    """``metrics/evaluate.json`` of a site."""

    site: Site
    ran_as: RanAs
    models: Annotated[dict[StateName, MetricsOrWithheld], Field(max_length=8)]


class Validation(Doc):
    """``metrics/validation-round-N.json`` of a site: global model N scored on the site's validation split."""

    site: Site
    round: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    metrics: MetricsOrWithheld

    @model_validator(mode="after")
    def _no_histograms(self) -> Validation:
        if getattr(self.metrics, "hist_pos", None) is not None:
            raise ValueError("a validation publishes no score histograms")
        return self


# ------------------------------------------------------------------ summary (coordinator)
class RoundDetail(Doc):
    round: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    sites: Annotated[list[Site], Field(max_length=MAX_SITES)]
    missing: Annotated[list[Site], Field(max_length=MAX_SITES)]
    rejected: Annotated[dict[Site, Text], Field(max_length=MAX_SITES)] = {}  # why a site's update was not used


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
    metric_names: Annotated[list[MetricName], Field(max_length=8)] = ["roc_auc", "pr_auc", "loss"]


# ------------------------------------------------------------------ control (coordinator)
class Abort(Doc):
    reason: Text


class Stop(Doc):
    """``control/stop.json``: training ended early (the validation metric stopped improving)."""

    after_round: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    reason: Text


class Newest(Doc):
    """``control/newest.json``: the newest global version of an async job (what a site pulls next)."""

    version: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    sha256: Sha256
    target: Annotated[int, Field(ge=1, le=MAX_ROUNDS)]  # the job ends at this version


class AsyncState(Doc):
    """``control/async-state.json``: the parameter server between two decisions, for a resumed coordinator."""

    version: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    decisions: Annotated[int, Field(ge=0, le=10**7)]
    next_seq: Annotated[dict[Site, Annotated[int, Field(ge=0, le=10**6)]], Field(max_length=MAX_SITES)]
    refused: Annotated[dict[Site, Annotated[int, Field(ge=0, le=10**6)]], Field(max_length=MAX_SITES)]
    buffer: AppliedList
    buffer_state: StateName | None = None


class Refresh(Doc):
    """``control/refresh-<site>.json``: the coordinator refused the site's update ``seq``; pull ``version``."""

    recipient: Site
    seq: Annotated[int, Field(ge=0, le=10**6)]
    base_version: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    version: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    staleness: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    reason: Text


# ------------------------------------------------------------------ the protocol
@dataclass(frozen=True)
class Artefact:
    """One kind of artefact: where it goes, who writes it, its byte bound and its schema.

    ``schema`` is None for a state file, whose checks are in :mod:`insitu.federated.states`.
    """

    kind: str
    pattern: re.Pattern[str]
    writer: Literal["coordinator", "site"]
    max_bytes: int
    schema: type[Doc] | None


_STATE = r"(round-\d{4,5}|champion|aggregator-round-\d{4,5}|async-buffer-\d{6,7})"
_ASYNC_UPDATE = r"async-\d{6,7}"
ARTEFACTS: tuple[Artefact, ...] = (
    Artefact("plan", re.compile(r"plan\.json"), "coordinator", 256 * KIB, Plan),
    Artefact("stats", re.compile(r"prepare\.json"), "site", 64 * KIB, PrepareStats),
    Artefact("stats", re.compile(r"global\.json"), "coordinator", 256 * KIB, GlobalStats),
    Artefact("weights", re.compile(_STATE + r"\.manifest\.json"), "coordinator", MAX_MANIFEST_BYTES, WeightsManifest),
    Artefact("weights", re.compile(_STATE + r"\.pt"), "coordinator", MAX_STATE_BYTES, None),
    Artefact("update", re.compile(r"round-\d{4,5}\.manifest\.json"), "site", MAX_MANIFEST_BYTES, UpdateManifest),
    Artefact("update", re.compile(r"round-\d{4,5}\.pt"), "site", MAX_STATE_BYTES, None),
    Artefact("metrics", re.compile(r"evaluate\.json"), "site", 256 * KIB, Evaluation),
    Artefact("metrics", re.compile(r"validation-round-\d{4,5}\.json"), "site", VALIDATION_BYTES, Validation),
    Artefact("summary", re.compile(r"summary\.json"), "coordinator", 4 * MIB, Summary),
    Artefact("control", re.compile(r"abort\.json"), "coordinator", 8 * KIB, Abort),
    Artefact("control", re.compile(r"stop\.json"), "coordinator", 8 * KIB, Stop),
    Artefact("update", re.compile(_ASYNC_UPDATE + r"\.manifest\.json"), "site", MAX_MANIFEST_BYTES,
             AsyncUpdateManifest),
    Artefact("update", re.compile(_ASYNC_UPDATE + r"\.pt"), "site", MAX_STATE_BYTES, None),
    Artefact("control", re.compile(r"newest\.json"), "coordinator", 8 * KIB, Newest),
    Artefact("control", re.compile(r"async-state\.json"), "coordinator", 256 * KIB, AsyncState),
    Artefact("control", re.compile(r"refresh-[a-z][a-z0-9-]{0,30}\.json"), "coordinator", 8 * KIB, Refresh),
)


def role(writer: str) -> Literal["coordinator", "site"]:
    return "coordinator" if writer == COORDINATOR else "site"


def artefact(kind: str, name: str, writer: str) -> Artefact:
    """The protocol's entry for ``kind/name`` written by ``writer``; ExchangeError if there is none."""
    where = f"{shown(kind, False)}/{shown(name, False)} of {shown(writer, False)}"
    found = [a for a in ARTEFACTS if a.kind == kind and a.pattern.fullmatch(name)]
    if not found:
        known = sorted({a.pattern.pattern.replace("\\", "") for a in ARTEFACTS if a.kind == kind})
        raise ExchangeError(f"{where}: not an artefact of the exchange protocol; {shown(kind)} allows {known}")
    mine = [a for a in found if a.writer == role(writer)]
    if not mine:
        raise ExchangeError(f"{where}: only the {found[0].writer} writes {shown(kind, False)}/{shown(name, False)}")
    return mine[0]


def check_document(art: Artefact, data: bytes, where: str, *, job_id: str, writer: str, name: str) -> Doc:
    """Validate the bytes of a JSON artefact against its schema and its place on the exchange.

    Raises
    ------
    ExchangeError
        Naming ``where`` (kind, name, writer) and the offending keys; never the values, which may be rows.
    """
    if art.schema is None:
        raise ExchangeError(f"{where}: a state file is not a JSON document")
    if len(data) > art.max_bytes:
        raise ExchangeError(f"{where}: {len(data):,} bytes; at most {art.max_bytes:,} are allowed")
    try:
        doc = art.schema.model_validate_json(data, strict=True)
    except ValidationError as e:
        raise ExchangeError(f"{where}: refused by the protocol: {explain(e)}") from None
    # A document says where it belongs; it must be where it is (no replaying another site's or job's).
    claims = {"job_id": job_id, "writer": writer, "site": writer, "name": name.split(".", 1)[0],
              "recipient": name.split(".", 1)[0].removeprefix("refresh-")}  # a notice names whom it is for
    for field, expected in claims.items():
        if field in type(doc).model_fields and getattr(doc, field) != expected:
            raise ExchangeError(f"{where}: its {field!r} is {shown(getattr(doc, field))}, not {shown(expected)}")
    return doc


def explain(e: ValidationError, limit: int = 5) -> str:
    """The offending keys and what is wrong with each; input values are left out (they may be rows)."""
    parts = []
    for err in e.errors(include_input=False, include_url=False, include_context=False)[:limit]:
        loc = ".".join(x if x == "[key]" else shown(x, False) for x in err["loc"]) or "$"
        msg = "key not allowed by the protocol" if err["type"] == "extra_forbidden" else err["msg"]
        parts.append(f"{loc}: {msg}")
    more = e.error_count() - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
