"""``training/*.yaml``: what one job trains and how — learning task, model, optimiser, rounds, aggregator,
in-site strategy, federation mode, split, gate, validation, checkpoints, registered model name.

Names of components (learning task, model, aggregator, strategy) are only parsed here: which names exist and
what options each takes is decided by the component itself, when :func:`insitu.job.load_job` resolves them.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from insitu.conf.errors import Refusal
from insitu.conf.names import IMPORT_PATH
from insitu.conf.strict import Strict


class ModelConfig(Strict):
    """A built-in model by name (``tabular_mlp``) or a user's own factory by import path (``pkg.mod:make``)."""

    name: str = "tabular_mlp"
    """a built-in model, or your own factory as package.module:function"""
    hidden: Annotated[list[Annotated[int, Field(ge=1, le=65536)]], Field(min_length=1)] = [64, 32]
    """tabular_mlp: width of each hidden layer"""
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.1
    """tabular_mlp: dropout after each hidden layer"""
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="keyword arguments of a user's model factory (JSON values)")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        # Which built-in names exist is the models' business (insitu/job.py resolves it); here only the shape.
        if not (v.isidentifier() or re.fullmatch(IMPORT_PATH, v)):
            raise ValueError("a model is a built-in name such as 'tabular_mlp', or your own factory as "
                             "'package.module:function' (see docs/bring-your-own.md)")
        return v


class TaskConfig(Strict):
    """What is learnt: the task decides the outputs, the loss, the metrics and what the gate may use."""

    name: str = "binary"
    """binary, multiclass or regression (or your own, see docs/extending.md)"""
    loss: Literal["mse", "huber", "poisson"] = Field(
        "mse", description="regression only: mse or huber on the standardised label; poisson for a count label "
                           "(log link: predictions are exp(output), never negative)")
    huber_delta: Annotated[float, Field(gt=0.0)] = 1.0
    """regression with loss huber: where the loss turns linear (standardised units)"""


class OptimizerConfig(Strict):
    name: Literal["adam", "sgd", "adamw"] = "adam"
    """adam, adamw or sgd"""
    lr: Annotated[float, Field(gt=0.0, le=10.0)] = 1e-3
    """learning rate"""
    weight_decay: Annotated[float, Field(ge=0.0)] = 0.0
    """L2 penalty (decoupled for adamw)"""
    momentum: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    """sgd only"""


class AggregatorConfig(Strict):
    """How the coordinator combines the sites' updates: an aggregator of insitu/federated/aggregators/ by
    name, with its options (e.g. ``{name: fedprox, options: {mu: 0.01}}``)."""

    name: str = "fedavg"
    """an aggregator of insitu/federated/aggregators/ (left out: median for a sync job of 3+ sites, else fedavg)"""
    options: dict[str, Any] = Field(default_factory=dict)
    """the aggregator's own options (see per aggregator below)"""


class StalenessConfig(Strict):
    """How much an update trained from an older global version counts, s(τ) (Xie et al. 2019, §5.2), with τ the
    staleness: ``constant`` 1; ``polynomial`` (1 + τ)^-a; ``hinge`` 1 up to τ = b, then 1 / (a·(τ − b) + 1)."""

    function: Literal["constant", "polynomial", "hinge"] = "polynomial"
    """constant, polynomial (1 + τ)^-a, or hinge"""
    a: Annotated[float, Field(ge=0.0, le=100.0)] = 0.5
    """polynomial's exponent; hinge's slope"""
    b: Annotated[int, Field(ge=0, le=10000)] = 4
    """hinge: staleness up to which an update counts fully"""


class AsyncConfig(Strict):
    """``federation.asynchronous``: the coordinator as a parameter server (used when ``federation.mode: async``).

    ``fedasync`` mixes every accepted update into the global model at once, w ← (1 − α_t)·w + α_t·w_site with
    α_t = alpha · s(staleness); ``fedbuff`` keeps ``buffer_size`` updates and then takes one server step,
    w ← w + alpha · mean_i(s(staleness_i) · (w_site_i − w_base_i)). Either way one application is one new
    global version, and an update whose staleness (newest version − the version it trained from) exceeds
    ``max_staleness`` is refused: the site is told to refresh, and the refusal is audited.
    """

    algorithm: Literal["fedasync", "fedbuff"] = "fedasync"
    """fedasync (apply each update) or fedbuff (apply a buffer of them)"""
    alpha: Annotated[float, Field(gt=0.0, le=10.0)] = Field(
        0.6, description="fedasync: the mixing weight (at most 1); fedbuff: the server learning rate")
    staleness: StalenessConfig = StalenessConfig()
    """how much an update from an older version counts"""
    # fedasync ignores it (every update is applied at once); not an error, so that a config can switch algorithm.
    buffer_size: Annotated[int, Field(ge=1, le=1000)] = Field(2, description="fedbuff: updates per server step")
    max_staleness: Annotated[int, Field(ge=0, le=10000)] = Field(
        4, description="refuse an update trained from a version more than this many versions old")

    @model_validator(mode="after")
    def _mixing(self) -> AsyncConfig:
        if self.algorithm == "fedasync" and self.alpha > 1.0:
            raise ValueError(f"fedasync mixes (1 - alpha)·w + alpha·w_site: alpha must be at most 1, got "
                             f"{self.alpha:g} (a larger step is fedbuff's server learning rate)")
        return self


class CompressionConfig(Strict):
    """``federation.compression``: how each site's update is encoded on its way to the coordinator (see
    docs/federation.md, "Lean updates"). The coordinator decodes an update before any check or aggregator sees
    it; what a lossy encoding drops, the site keeps and adds to its next update (error feedback)."""

    encoding: str = "none"
    """none (full fp32 state dicts), fp16, bf16, int8 or topk (a codec of insitu/federated/codecs/)"""
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="the codec's own options: int8 {scale: tensor|channel}; "
                                                "topk {fraction: 0.01}")
    delta: bool = True
    """encode the update minus the global model it was trained from (topk requires it)"""
    error_feedback: bool = True
    """the site keeps what a lossy encoding dropped and adds it to its next update"""


class FederationConfig(Strict):
    min_sites: Annotated[int, Field(ge=1)] = 1
    """the quorum: a phase or round fails with fewer sites than this"""
    round_deadline_s: Annotated[float, Field(gt=0)] = Field(
        180.0, description="sync: how long a round waits for updates; async: how long the coordinator waits for "
                           "the next update before it gives up on the job")
    prepare_deadline_s: Annotated[float, Field(gt=0)] = Field(
        900.0, description="how long the coordinator waits for the sites' preparation; a site still preparing "
                           "then is left out (its run cancelled, the reason in the summary) and the quorum decides")
    mode: Literal["sync", "async"] = Field(
        "sync", description="sync: rounds (every site trains the same global model, the coordinator waits for "
                            "them); async: sites train continuously and the coordinator applies updates as they "
                            "arrive (see asynchronous); either way `rounds` counts the global versions made")
    asynchronous: AsyncConfig = AsyncConfig()
    """federation.mode async: the parameter server's algorithm"""
    compression: CompressionConfig = CompressionConfig()
    """how updates are encoded on the wire"""


class SplitConfig(Strict):
    train: Annotated[float, Field(gt=0, lt=1)] = 0.7
    """fraction of rows trained on"""
    val: Annotated[float, Field(ge=0, lt=1)] = 0.15
    """fraction of rows for per-round validation"""
    test: Annotated[float, Field(gt=0, lt=1)] = 0.15
    """fraction of rows the gate scores on"""

    @model_validator(mode="after")
    def _sum(self) -> SplitConfig:
        total = self.train + self.val + self.test
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"train + val + test must equal 1.0 (got {total:g})")
        return self


class CheckpointConfig(Strict):
    """In-site checkpoints (torch.distributed.checkpoint) to the site's store."""

    enabled: bool = True
    """write checkpoints"""
    every_steps: Annotated[int, Field(ge=0)] = 0  # 0: at the end of every local epoch only
    """checkpoint every this many steps (0: at the end of each local epoch)"""


class GateConfig(Strict):
    """When a candidate replaces the champion (see insitu/gate.py)."""

    primary_metric: str | None = Field(None, description="a gate metric of the task; empty: the task's first "
                                       "(binary pr_auc, multiclass macro_f1, regression rmse)")
    margin: Annotated[float, Field(ge=0.0)] = 0.0
    """how much the candidate must beat the champion by"""
    max_site_drop: Annotated[float, Field(ge=0.0)] = 0.05
    """largest drop at any one site the gate accepts"""
    absolute_floor: float | None = Field(None, description="what the very first model must reach: a floor for a "
                                         "higher-is-better metric, a ceiling otherwise; empty: the task's default")


class ValidationConfig(Strict):
    """Per-round federated validation: every round, each site scores the new global model on its own
    validation split; the coordinator combines the sites' metrics into one value per round."""

    metric: str | None = Field(None, description="a gate metric of the task; empty: the gate's primary metric")
    patience: Annotated[int, Field(ge=0)] = Field(
        0, description="stop early after this many rounds without improvement (0: never stop early)")
    min_delta: Annotated[float, Field(ge=0.0)] = Field(0.0, description="smaller improvements do not count")
    select: Literal["best", "last"] = Field(
        "best", description="the model registered and gated: the best round by the validation metric, or the last")
    combine: Literal["auto", "pooled", "median", "trimmed_mean"] = Field(
        "auto", description="how the sites' validation and test metrics combine where they decide something (the "
                            "best round, early stopping, the gate): pooled (the task's exact sample-weighted "
                            "combination), median or trimmed_mean across sites (one lying site cannot move them); "
                            "auto: median with 3 or more sites, pooled below")
    trim: Annotated[float, Field(ge=0.0, lt=0.5)] = Field(
        0.34, description="combine trimmed_mean: the fraction of sites dropped at each end (rounded down; 0.34 "
                          "drops one of three)")
    max_disagreement: Annotated[float, Field(gt=0.0)] = Field(
        0.25, description="a site whose metric differs from the sites' median by more than this is named in the job "
                          "summary and the log (3 or more sites)")


class RegistryConfig(Strict):
    model_name: Annotated[str, Field(min_length=1)] = "insitu-fraud"
    """the registered model's name in MLflow"""


class TrainingConfig(Strict):
    task: TaskConfig = TaskConfig()
    """the learning task (a name is short for {name: …})"""
    model: ModelConfig = ModelConfig()
    """the model every site builds"""
    optimizer: OptimizerConfig = OptimizerConfig()
    """each site's local optimizer"""
    rounds: Annotated[int, Field(ge=1, le=10000)] = 5
    """federated rounds (async: global versions)"""
    local_epochs: Annotated[int, Field(ge=1, le=1000)] = 1
    """passes over a site's training rows per round"""
    batch_size: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    """rows per step per site (split across its data-parallel ranks)"""
    aggregator: AggregatorConfig = AggregatorConfig()
    """how the coordinator combines the sites' updates (a name is short for {name: …})"""
    seed: int = 0
    """seeds the initial model and each site's shuffling"""
    strategy: str = "single"
    """how a site's ranks share the work: single, ddp, fsdp, pipeline or hybrid"""
    ranks_per_site: Annotated[int, Field(ge=1, le=1024)] = 1
    """ranks each site trains with (one per Dask worker)"""
    parallel: Annotated[dict[str, Any], Field(max_length=16)] = Field(
        default_factory=dict, description="the in-site strategies' options, one section each (fsdp, pipeline, mesh); "
                                          "each strategy validates its own (see docs/strategies.md)")
    federation: FederationConfig = FederationConfig()
    """rounds across sites: quorum, deadline, sync or async"""
    split: SplitConfig = SplitConfig()
    """fractions of each site's rows for train, validation and test"""
    registry: RegistryConfig = RegistryConfig()
    """where MLflow registers the model"""
    gate: GateConfig = GateConfig()
    """when a candidate replaces the champion"""
    validation: ValidationConfig = ValidationConfig()
    """per-round validation, early stopping, which round is registered"""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """in-site checkpoints to the site's store (a retried round resumes)"""

    @field_validator("task", mode="before")
    @classmethod
    def _task_name(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v  # `task: multiclass` is short for `task: {name: …}`

    @field_validator("aggregator", mode="before")
    @classmethod
    def _aggregator_name(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v  # `aggregator: fedavg` is short for `{name: fedavg}`

    @field_validator("ranks_per_site")
    @classmethod
    def _ranks(cls, v: int, info: ValidationInfo) -> int:
        if info.data.get("strategy") == "single" and v != 1:
            raise ValueError("strategy 'single' runs one rank per site: set ranks_per_site: 1")
        return v

    @model_validator(mode="after")
    def _async_mode(self) -> TrainingConfig:
        """What async mode cannot do (yet), said at load time rather than found out mid-job."""
        if self.federation.mode != "async":
            return self
        if self.validation.select != "last" or self.validation.patience:
            raise Refusal("federation.mode async registers the last global version (sites validate only the "
                           "versions they pull, so there is no complete history to pick the best from or to "
                           "stop early on): set validation.select: last and validation.patience: 0",
                           at=("validation",))
        return self


ROBUST_AGGREGATOR = "median"
ROBUST_FROM_SITES = 3


def default_aggregator(t: TrainingConfig, n_sites: int) -> TrainingConfig:
    """``t`` with the aggregator a config that names none gets: the coordinate-wise median for a synchronous job
    of ``ROBUST_FROM_SITES`` or more sites (no one site can pull the global model where it likes, whatever it
    claims), FedAvg otherwise (with two sites a median is their mean; async mode combines updates with its own
    algorithm). An aggregator the config names is kept."""
    if "aggregator" in t.model_fields_set:
        return t
    robust = t.federation.mode == "sync" and n_sites >= ROBUST_FROM_SITES
    return t.model_copy(update={"aggregator": AggregatorConfig(name=ROBUST_AGGREGATOR if robust else "fedavg")})
