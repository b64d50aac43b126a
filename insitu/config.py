"""Pydantic models for everything in ``conf/``, loaded with errors that name file, key and fix.

A wrong configuration must fail before anything starts. Every loader here raises
:class:`ConfigError`, whose message names the YAML file, the dotted key and what
was expected, e.g.::

    conf/training/fraud.yaml: key 'optimizer.lr': Input should be greater than 0 (got -1)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import types
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

if TYPE_CHECKING:
    from insitu.specs.base import TaskSpec

SITE_NAME = r"^[a-z][a-z0-9-]{0,30}$"
ENV_NAME = r"^[A-Z_][A-Z0-9_]*$"
# What a run may name: a training config (a file of conf/training/) or a dataset (a key of datasets.yaml).
CONF_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
# A job id becomes part of store prefixes, run names and registry tags: plain characters only, no '/'.
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
STORE_SCHEMES = ("s3", "file", "memory", "gs", "abfs", "az")
# Schemes whose first path segment is a bucket (or container): DNS-like names, compared ignoring case.
_BUCKET_SCHEMES = ("s3", "gs", "abfs", "az")
# Two spellings of one service: a store named both ways is one store.
_SAME_SERVICE = {"az": "abfs"}
# A user's own model: "package.module:factory" (see insitu/models/__init__.py for the contract).
IMPORT_PATH = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"


class ConfigError(ValueError):
    """A configuration file is missing, unparsable or invalid."""


class _Refusal(ValueError):
    """A validator's error that names its own key and may keep the value out of the message.

    ``at`` is the key relative to where pydantic reports the error (a model validator reports at the
    model's own location, which for a whole file is its top level); ``echo=False`` hides the input.
    """

    def __init__(self, message: str, at: tuple[str | int, ...] = (), echo: bool = True) -> None:
        super().__init__(message)
        self.at = at
        self.echo = echo


def _short(value: object, limit: int = 40) -> str:
    """``repr(value)``, cut to ``limit`` characters: a caller's value is shown, never a caller's essay."""
    r = repr(value)
    return r if len(r) <= limit else r[: limit - 1] + "…"


def check_job_id(job_id: str) -> str:
    """``job_id`` if it matches :data:`JOB_ID_PATTERN`.

    Raises
    ------
    ValueError
        When it does not (the message shows at most 40 characters of it).
    """
    # fullmatch, not match: '$' alone would let a trailing newline through.
    if not isinstance(job_id, str) or not re.fullmatch(JOB_ID_PATTERN, job_id):
        raise ValueError(
            f"job_id {_short(job_id)} is not a job id: use 1-100 letters, digits, '.', '_' or '-', starting "
            f"with a letter or digit ({JOB_ID_PATTERN})"
        )
    return job_id


def normalise_store_url(url: str) -> str:
    """``url`` spelt one way only, so that two spellings of one store compare equal.

    The scheme is lower-cased, and so is a bucket (bucket names are DNS-like), empty and ``.`` segments
    are dropped, ``..`` is applied and a trailing ``/`` added: ``S3://Insitu-EU//a/./b/../`` is
    ``s3://insitu-eu/a/``. No message includes the URL (it could hold a pasted credential).

    Raises
    ------
    ValueError
        For another scheme, no bucket, a bucket that is not a plain name, a ``..`` that climbs above the
        bucket (or ``/``), a query string, fragment, %-escape, backslash or whitespace.
    """
    m = re.fullmatch(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)", url, flags=re.DOTALL)
    if m is None or m[1].lower() not in STORE_SCHEMES:
        raise ValueError(f"must be an fsspec URL such as s3://bucket/ or file:///abs/path (schemes: "
                         f"{', '.join(STORE_SCHEMES)})")
    scheme, rest = m[1].lower(), m[2]
    # Clients read these differently ('?' starts a query for one, is part of a key for another), so two
    # spellings could name one store without comparing equal.
    if re.search(r"[?#%\\\s]", rest):
        raise ValueError("must not hold a query string (?), fragment (#), %-escape, backslash or whitespace: "
                         "write the plain bucket and prefix, e.g. s3://bucket/prefix/")
    if scheme == "file":
        if not rest.startswith("/"):
            raise ValueError("a file URL needs an absolute path: file:///abs/path (three slashes)")
        root, path = "", rest
    else:
        root, _, path = rest.partition("/")
        if not root:
            raise ValueError(f"names no bucket: write {scheme}://bucket/ or {scheme}://bucket/prefix/")
        # '@' stays allowed for abfs's container@account; a ':' would be a key:secret pasted in.
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._@-]*", root) or root in (".", ".."):
            raise _Refusal("the bucket must be a plain name (letters, digits, '.', '_', '-'); credentials never "
                           "go in the URL: name their variables in key_env and secret_env", echo=False)
        if scheme in _BUCKET_SCHEMES:
            root = root.lower()
    kept: list[str] = []
    for seg in path.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if not kept:
                raise ValueError("a '..' segment climbs above the bucket (or /): write the store's own path")
            kept.pop()
        else:
            kept.append(seg)
    return f"{scheme}://{root}/" + "".join(f"{seg}/" for seg in kept)


def stores_overlap(a: str, b: str) -> bool:
    """Whether two stores (normalised URLs) share objects: equal, or one inside the other.

    Both end in ``/``, so a prefix is one at a segment boundary: ``s3://b/eu/`` holds ``s3://b/eu/x/`` but
    not ``s3://b/eu2/``.
    """
    a, b = _one_service(a), _one_service(b)
    return a.startswith(b) or b.startswith(a)


def _one_service(url: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"{_SAME_SERVICE.get(scheme, scheme)}://{rest}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- sites.yaml
class StorageRef(_Strict):
    """Where a store lives and which environment variables hold its endpoint and keys."""

    storage: str = Field(description="fsspec URL of the store root, e.g. s3://bucket/ or file:///path")
    endpoint_env: Annotated[str, Field(pattern=ENV_NAME)] | None = None
    key_env: Annotated[str, Field(pattern=ENV_NAME)] | None = None
    secret_env: Annotated[str, Field(pattern=ENV_NAME)] | None = None

    @field_validator("storage")
    @classmethod
    def _url(cls, v: str) -> str:
        # One spelling per store, so that the overlap checks of SitesConfig compare like with like.
        return normalise_store_url(v)


class DaskRef(_Strict):
    scheduler_env: Annotated[str, Field(pattern=ENV_NAME)] = Field(
        description="environment variable that holds this site's Dask scheduler address"
    )
    local_workers: Annotated[int, Field(ge=1, le=64)] = 2


class SiteConfig(StorageRef):
    name: Annotated[str, Field(pattern=SITE_NAME)]
    work_pool: str
    dask: DaskRef
    devices: Literal["cpu", "cuda"] = "cpu"


class CoordinatorConfig(_Strict):
    work_pool: str = "insitu-coordinator"


class SitesConfig(_Strict):
    exchange: StorageRef
    coordinator: CoordinatorConfig = CoordinatorConfig()
    sites: Annotated[list[SiteConfig], Field(min_length=1)]

    @model_validator(mode="after")
    def _own(self) -> SitesConfig:
        # A site owns its name, pool, store and the variables that hold its keys: anything shared would let
        # one site's worker (or the exchange's users) reach another's rows.
        for attr in ("name", "work_pool"):
            first: dict[str, int] = {}
            for i, s in enumerate(self.sites):
                v = getattr(s, attr)
                if v in first:
                    raise _Refusal(f"two sites share {attr} {v!r} (sites[{first[v]}].{attr}); give each site "
                                   f"its own {attr}", at=("sites", i, attr))
                first[v] = i
        self._own_stores()
        self._own_variables()
        return self

    def _own_stores(self) -> None:
        stores: list[tuple[tuple[str | int, ...], str]] = [(("exchange", "storage"), self.exchange.storage)]
        stores += [(("sites", i, "storage"), s.storage) for i, s in enumerate(self.sites)]
        for j, (key, url) in enumerate(stores):
            for key0, url0 in stores[:j]:
                if not stores_overlap(url0, url):
                    continue
                why = ("the exchange needs a store of its own (rows could otherwise leak into it)"
                       if key0[0] == "exchange" else "give each site a store of its own (a site could "
                       "otherwise read or overwrite another's rows)")
                raise _Refusal(f"store {url} overlaps {_format_loc(key0)} {url0}; {why}: use another bucket, or "
                               "prefixes neither of which contains the other", at=key)

    def _own_variables(self) -> None:
        owners: list[tuple[tuple[str | int, ...], StorageRef]] = [(("exchange",), self.exchange)]
        owners += [(("sites", i), s) for i, s in enumerate(self.sites)]
        first: dict[str, tuple[str | int, ...]] = {}
        for at, ref in owners:
            slots: list[tuple[tuple[str, ...], str | None]] = [
                ((f,), getattr(ref, f)) for f in ("endpoint_env", "key_env", "secret_env")
            ]
            if isinstance(ref, SiteConfig):
                slots.append((("dask", "scheduler_env"), ref.dask.scheduler_env))
            for slot, var in slots:
                if var is None:
                    continue
                key = (*at, *slot)
                if var in first:
                    raise _Refusal(f"variable {var} is also named by {_format_loc(first[var])}; each site and "
                                   "the exchange name variables of their own (whoever holds one would otherwise "
                                   "hold the other's endpoint or keys): rename one of them", at=key)
                first[var] = key

    def site(self, name: str) -> SiteConfig:
        for s in self.sites:
            if s.name == name:
                return s
        raise ConfigError(f"unknown site {name!r}; sites.yaml defines {[s.name for s in self.sites]}")

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sites]


# --------------------------------------------------------------------------- datasets.yaml
class ColumnSpec(_Strict):
    type: Literal["string", "float", "int", "bool", "category"]
    min: float | None = None
    max: float | None = None
    values: list[str] | None = None
    nullable: bool = False
    transform: Literal["none", "log1p"] = Field(
        "none", description="feature transform, declared (never implicit): log1p for heavy-tailed non-negatives")

    @model_validator(mode="after")
    def _values(self) -> ColumnSpec:
        if self.type == "category" and not self.values:
            raise ValueError("a category column needs a non-empty 'values' list")
        if self.type != "category" and self.values is not None:
            raise ValueError("'values' is only allowed for type: category")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is greater than max ({self.max})")
        if self.transform == "log1p" and (self.type not in ("float", "int") or self.min is None or self.min < 0):
            raise ValueError("transform: log1p needs a float or int column with min >= 0 (log1p of a value below "
                             "-1 is undefined); set min: 0 or use transform: none")
        return self


class SchemaConfig(_Strict):
    id: str
    label: str
    columns: Annotated[dict[str, ColumnSpec], Field(min_length=2)]

    @model_validator(mode="after")
    def _keys(self) -> SchemaConfig:
        for role in ("id", "label"):
            col = getattr(self, role)
            if col not in self.columns:
                raise ValueError(f"{role} column {col!r} is not among the columns {list(self.columns)}")
        label = self.columns[self.label]
        if label.type == "string":
            raise ValueError(f"label column {self.label!r} has type: string; a label is bool (binary), category "
                             "(multi-class) or float/int (regression)")
        if label.nullable:
            raise ValueError(f"label column {self.label!r} may not be nullable: a row without a label cannot train")
        if label.transform != "none":
            raise ValueError(f"label column {self.label!r}: transforms apply to features, not to the label")
        for name, spec in self.feature_columns.items():
            # A missing number would reach the model (and the federated sums) as NaN: insitu does not impute.
            if spec.nullable and spec.type in ("float", "int", "bool"):
                raise _Refusal(f"feature {name!r} of type {spec.type} is nullable, and insitu does not impute "
                               "missing numbers: fill them before `insitu data put`, or set nullable: false to "
                               "quarantine rows that lack it", at=("columns", name, "nullable"))
        return self

    @property
    def feature_columns(self) -> dict[str, ColumnSpec]:
        return {k: v for k, v in self.columns.items() if k not in (self.id, self.label)}


class ShardConfig(_Strict):
    id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")]
    site: str
    path: str

    @field_validator("path")
    @classmethod
    def _relative(cls, v: str) -> str:
        if "://" in v or v.startswith("/") or ".." in v.split("/"):
            raise ValueError("must be a path relative to the site's storage URL (no scheme, no leading /, no ..)")
        if not v.endswith((".parquet", ".csv")):
            raise ValueError("a shard is one .parquet or .csv file")
        return v


class ScheduleConfig(_Strict):
    """One recurring ``retrain`` of the dataset it is declared in (``insitu deploy`` puts it on Prefect).

    Checked here without Prefect (the core never imports it): five cron fields and a time zone name.
    Prefect checks each field's values when the schedule is deployed; ``insitu validate`` asks it too.
    """

    cron: str = Field(description="minute hour day-of-month month day-of-week, e.g. '0 3 * * 1' (Mondays 03:00)")
    timezone: str = Field("UTC", description="IANA time zone the cron is read in, e.g. Europe/Berlin")
    training: Annotated[str, Field(pattern=CONF_NAME, description="a config of conf/training/, by name")]
    active: bool = True

    @field_validator("cron")
    @classmethod
    def _five_fields(cls, v: str) -> str:
        fields = v.split()
        if len(fields) != 5:
            raise ValueError(f"a cron has five fields (minute hour day-of-month month day-of-week), this one "
                             f"{len(fields)}; e.g. '0 3 * * 1' for Mondays at 03:00")
        return " ".join(fields)  # one spelling, so that repeated entries are recognised

    @field_validator("timezone")
    @classmethod
    def _iana(cls, v: str) -> str:
        # Exactly the names Prefect admits (it checks against zoneinfo's list too); imported here, as only
        # datasets with schedules need it.
        from zoneinfo import available_timezones

        if v not in available_timezones():
            raise ValueError("not an IANA time zone name; use e.g. UTC, Europe/Berlin or America/New_York "
                             "(the case matters)")
        return v


class DatasetConfig(_Strict):
    description: str = ""
    # Keys the deterministic train/val/test split. Fixed per dataset so that every job (whatever its
    # training seed) tests on the same rows: a champion is never scored on rows it trained on.
    split_key: int = 0
    schema_: SchemaConfig = Field(alias="schema")
    shards: Annotated[list[ShardConfig], Field(min_length=1)]
    schedules: list[ScheduleConfig] = []

    @field_validator("schedules")
    @classmethod
    def _distinct(cls, schedules: list[ScheduleConfig]) -> list[ScheduleConfig]:
        # The same entry twice would start two identical jobs at every tick.
        first: dict[tuple[str, str, str], int] = {}
        for i, s in enumerate(schedules):
            key = (s.cron, s.timezone, s.training)
            if key in first:
                raise _Refusal(f"repeats schedules[{first[key]}] (same cron, timezone and training); remove one",
                               at=(i,))
            first[key] = i
        return schedules

    @field_validator("shards")
    @classmethod
    def _unique(cls, shards: list[ShardConfig]) -> list[ShardConfig]:
        # Compared ignoring case: a shard id names files and audit entries, and a store or file system that
        # ignores case would give EU-000 and eu-000 the same ones.
        first: dict[str, int] = {}
        for i, s in enumerate(shards):
            folded = s.id.casefold()
            if folded in first:
                j = first[folded]
                raise _Refusal(f"shard ids must be unique, ignoring case: {s.id!r} repeats shards[{j}].id "
                               f"{shards[j].id!r}; rename one of them", at=(i, "id"), echo=False)
            first[folded] = i
        return shards

    def shards_of(self, site: str) -> list[ShardConfig]:
        return [s for s in self.shards if s.site == site]

    def shard(self, shard_id: str) -> ShardConfig:
        for s in self.shards:
            if s.id == shard_id:
                return s
        raise KeyError(shard_id)


class DatasetsConfig(_Strict):
    datasets: Annotated[dict[str, DatasetConfig], Field(min_length=1)]

    @field_validator("datasets")
    @classmethod
    def _names(cls, datasets: dict[str, DatasetConfig]) -> dict[str, DatasetConfig]:
        # A run names its dataset by key, and only a CONF_NAME is admitted: any other key could never be run.
        for name in datasets:
            if not re.fullmatch(CONF_NAME, name):
                raise _Refusal(f"dataset {_short(name)} is not a plain name ({CONF_NAME}); rename it",
                               echo=False)
        return datasets


# --------------------------------------------------------------------------- training/*.yaml
class ModelConfig(_Strict):
    """A built-in model by name (``tabular_mlp``) or a user's own factory by import path (``pkg.mod:make``)."""

    name: str = "tabular_mlp"
    hidden: Annotated[list[Annotated[int, Field(ge=1, le=65536)]], Field(min_length=1)] = [64, 32]
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.1
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="keyword arguments of a user's model factory (JSON values)")

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        from insitu.models import MODELS  # the one list of built-in models (imported late: it imports torch)

        if v not in MODELS and not re.fullmatch(IMPORT_PATH, v):
            raise ValueError(f"unknown model {v!r}; built in: {sorted(MODELS)}, or your own factory as "
                             "'package.module:function' (see the README, 'Bring your own data and model')")
        return v


class TaskConfig(_Strict):
    """What is learnt: the task decides the outputs, the loss, the metrics and what the gate may use."""

    name: str = "binary"
    loss: Literal["mse", "huber", "poisson"] = Field(
        "mse", description="regression only: mse or huber on the standardised label; poisson for a count label "
                           "(log link: predictions are exp(output), never negative)")
    huber_delta: Annotated[float, Field(gt=0.0)] = 1.0

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        from insitu.specs import TASKS

        if v not in TASKS:
            raise ValueError(f"unknown task {v!r}; known: {sorted(TASKS)}")
        return v


class OptimizerConfig(_Strict):
    name: Literal["adam", "sgd", "adamw"] = "adam"
    lr: Annotated[float, Field(gt=0.0, le=10.0)] = 1e-3
    weight_decay: Annotated[float, Field(ge=0.0)] = 0.0
    momentum: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0


class AggregatorConfig(_Strict):
    """How the coordinator combines the sites' updates: an aggregator of insitu/federated/aggregators/ by
    name, with its options (e.g. ``{name: fedprox, options: {mu: 0.01}}``)."""

    name: str = "fedavg"
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known(self) -> AggregatorConfig:
        from insitu.federated.aggregators import build_aggregator  # the one list of aggregators

        build_aggregator(self.name, self.options)  # unknown name or option: ValueError naming the known ones
        return self


# The aggregators whose only part in async mode is what sites train with (FedProx's proximal term, as in
# FedAsync's paper); the server step is federation.asynchronous.algorithm's.
ASYNC_SITE_AGGREGATORS = ("fedavg", "fedprox")


class StalenessConfig(_Strict):
    """How much an update trained from an older global version counts, s(τ) (Xie et al. 2019, §5.2), with τ the
    staleness: ``constant`` 1; ``polynomial`` (1 + τ)^-a; ``hinge`` 1 up to τ = b, then 1 / (a·(τ − b) + 1)."""

    function: Literal["constant", "polynomial", "hinge"] = "polynomial"
    a: Annotated[float, Field(ge=0.0, le=100.0)] = 0.5
    b: Annotated[int, Field(ge=0, le=10000)] = 4


class AsyncConfig(_Strict):
    """``federation.asynchronous``: the coordinator as a parameter server (used when ``federation.mode: async``).

    ``fedasync`` mixes every accepted update into the global model at once, w ← (1 − α_t)·w + α_t·w_site with
    α_t = alpha · s(staleness); ``fedbuff`` keeps ``buffer_size`` updates and then takes one server step,
    w ← w + alpha · mean_i(s(staleness_i) · (w_site_i − w_base_i)). Either way one application is one new
    global version, and an update whose staleness (newest version − the version it trained from) exceeds
    ``max_staleness`` is refused: the site is told to refresh, and the refusal is audited.
    """

    algorithm: Literal["fedasync", "fedbuff"] = "fedasync"
    alpha: Annotated[float, Field(gt=0.0, le=10.0)] = Field(
        0.6, description="fedasync: the mixing weight (at most 1); fedbuff: the server learning rate")
    staleness: StalenessConfig = StalenessConfig()
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


class FederationConfig(_Strict):
    min_sites: Annotated[int, Field(ge=1)] = 1
    round_deadline_s: Annotated[float, Field(gt=0)] = Field(
        180.0, description="sync: how long a round waits for updates; async: how long the coordinator waits for "
                           "the next update before it gives up on the job")
    mode: Literal["sync", "async"] = Field(
        "sync", description="sync: rounds (every site trains the same global model, the coordinator waits for "
                            "them); async: sites train continuously and the coordinator applies updates as they "
                            "arrive (see asynchronous); either way `rounds` counts the global versions made")
    asynchronous: AsyncConfig = AsyncConfig()
    # A test and benchmark knob, not a production setting: a site named here sleeps this long after training,
    # before it publishes its update, so that one site is deliberately slow. A site reads its own entry from
    # its own copy of the approved config, so the coordinator cannot slow a site down.
    simulated_delay_s: Annotated[dict[Annotated[str, Field(pattern=SITE_NAME)],
                                      Annotated[float, Field(ge=0.0, le=3600.0)]], Field(max_length=64)] = Field(
        default_factory=dict, description="test/benchmark knob: {site: seconds} a site waits before publishing "
                                          "each update (a deliberately slow site)")


class SplitConfig(_Strict):
    train: Annotated[float, Field(gt=0, lt=1)] = 0.7
    val: Annotated[float, Field(ge=0, lt=1)] = 0.15
    test: Annotated[float, Field(gt=0, lt=1)] = 0.15

    @model_validator(mode="after")
    def _sum(self) -> SplitConfig:
        total = self.train + self.val + self.test
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"train + val + test must equal 1.0 (got {total:g})")
        return self


class CheckpointConfig(_Strict):
    """In-site checkpoints (torch.distributed.checkpoint) to the site's store."""

    enabled: bool = True
    every_steps: Annotated[int, Field(ge=0)] = 0  # 0: at the end of every local epoch only


class GateConfig(_Strict):
    """When a candidate replaces the champion (see insitu/gate.py)."""

    primary_metric: str | None = Field(None, description="a gate metric of the task; empty: the task's first "
                                       "(binary pr_auc, multiclass macro_f1, regression rmse)")
    margin: Annotated[float, Field(ge=0.0)] = 0.0
    max_site_drop: Annotated[float, Field(ge=0.0)] = 0.05
    absolute_floor: float | None = Field(None, description="what the very first model must reach: a floor for a "
                                         "higher-is-better metric, a ceiling otherwise; empty: the task's default")


class ValidationConfig(_Strict):
    """Per-round federated validation: every round, each site scores the new global model on its own
    validation split; the coordinator combines the sites' metrics into one value per round."""

    metric: str | None = Field(None, description="a gate metric of the task; empty: the gate's primary metric")
    patience: Annotated[int, Field(ge=0)] = Field(
        0, description="stop early after this many rounds without improvement (0: never stop early)")
    min_delta: Annotated[float, Field(ge=0.0)] = Field(0.0, description="smaller improvements do not count")
    select: Literal["best", "last"] = Field(
        "best", description="the model registered and gated: the best round by the validation metric, or the last")


class FsdpConfig(_Strict):
    """Strategy ``fsdp`` (and the data-parallel part of ``hybrid``): FSDP2 ``fully_shard`` options."""

    mixed_precision: Literal["auto", "bf16", "fp32"] = Field(
        "auto", description="parameter dtype in forward/backward (gradients are reduced in fp32): auto is bf16 "
                            "on GPU and fp32 on CPU")
    activation_checkpointing: bool = Field(False, description="recompute each block's activations in backward "
                                           "(less memory, about a third more compute)")
    reshard_after_forward: bool = Field(True, description="free gathered parameters after forward (ZeRO-3); "
                                        "false keeps them until backward (ZeRO-2: more memory, less traffic)")


class PipelineConfig(_Strict):
    """Strategy ``pipeline`` (and the pipeline part of ``hybrid``): ``torch.distributed.pipelining``."""

    schedule: Literal["gpipe", "1f1b"] = Field("1f1b", description="GPipe (all forwards, then all backwards) or "
                                               "1F1B (interleaved: fewer activations alive at once)")
    microbatches: Annotated[int, Field(ge=1, le=4096)] = Field(
        4, description="micro-batches per step; the per-replica batch must be a multiple of it")
    split_points: list[Annotated[int, Field(ge=1)]] | None = Field(
        None, description="the block index where each stage after the first begins (one per extra stage); "
                          "empty: blocks split evenly")


MESH_DIMS = ("pp", "dp_replicate", "dp_shard")


class ParallelConfig(_Strict):
    """How a site's ranks share the model (see the README, 'Which strategy when')."""

    mesh: dict[str, Annotated[int, Field(ge=1)]] = Field(
        default_factory=dict, description="strategy hybrid: the device mesh's shape, e.g. {pp: 2, dp_shard: 2} "
        "(pipeline × FSDP) or {dp_replicate: 2, dp_shard: 2} (HSDP); the sizes multiply to ranks_per_site")
    fsdp: FsdpConfig = FsdpConfig()
    pipeline: PipelineConfig = PipelineConfig()

    @field_validator("mesh")
    @classmethod
    def _dims(cls, v: dict[str, int]) -> dict[str, int]:
        unknown = sorted(set(v) - set(MESH_DIMS))
        if unknown:
            raise ValueError(f"unknown mesh dimension(s) {unknown}; known: {list(MESH_DIMS)}")
        return {d: v[d] for d in MESH_DIMS if d in v}  # one order, whatever the file's


class RegistryConfig(_Strict):
    model_name: Annotated[str, Field(min_length=1)] = "insitu-fraud"


class TrainingConfig(_Strict):
    task: TaskConfig = TaskConfig()
    model: ModelConfig = ModelConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    rounds: Annotated[int, Field(ge=1, le=10000)] = 5
    local_epochs: Annotated[int, Field(ge=1, le=1000)] = 1
    batch_size: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    aggregator: AggregatorConfig = AggregatorConfig()
    seed: int = 0
    strategy: str = "single"
    ranks_per_site: Annotated[int, Field(ge=1, le=1024)] = 1
    parallel: ParallelConfig = ParallelConfig()
    federation: FederationConfig = FederationConfig()
    split: SplitConfig = SplitConfig()
    registry: RegistryConfig = RegistryConfig()
    gate: GateConfig = GateConfig()
    validation: ValidationConfig = ValidationConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()

    @field_validator("task", mode="before")
    @classmethod
    def _task_name(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v  # `task: multiclass` is short for `task: {name: …}`

    @field_validator("aggregator", mode="before")
    @classmethod
    def _aggregator_name(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v  # `aggregator: fedavg` is short for `{name: fedavg}`

    @field_validator("strategy")
    @classmethod
    def _strategy(cls, v: str) -> str:
        from insitu.parallel.strategies import strategy_module  # the one list of strategies

        strategy_module(v)  # imports only that strategy's module; an unknown name's error lists the known ones
        return v

    @field_validator("ranks_per_site")
    @classmethod
    def _ranks(cls, v: int, info: ValidationInfo) -> int:
        if info.data.get("strategy") == "single" and v != 1:
            raise ValueError("strategy 'single' runs one rank per site: set ranks_per_site: 1")
        return v

    @model_validator(mode="after")
    def _layout(self) -> TrainingConfig:
        """The strategy's layout fits the ranks and the batch (its own check, in its module)."""
        from insitu.parallel.strategies import strategy_module

        check = getattr(strategy_module(self.strategy), "check_config", None)
        if check is not None:
            check(self)  # ValueError naming the key and the fix
        return self

    @model_validator(mode="after")
    def _async_mode(self) -> TrainingConfig:
        """What async mode cannot do (yet), said at load time rather than found out mid-job."""
        if self.federation.mode != "async":
            return self
        if self.aggregator.name not in ASYNC_SITE_AGGREGATORS:
            raise _Refusal(f"federation.mode async combines updates with federation.asynchronous.algorithm; "
                           f"aggregator {self.aggregator.name!r} is a synchronous round's: use one of "
                           f"{list(ASYNC_SITE_AGGREGATORS)} (they only decide what sites train with)",
                           at=("aggregator",))
        if self.validation.select != "last" or self.validation.patience:
            raise _Refusal("federation.mode async registers the last global version (sites validate only the "
                           "versions they pull, so there is no complete history to pick the best from or to "
                           "stop early on): set validation.select: last and validation.patience: 0",
                           at=("validation",))
        return self


# --------------------------------------------------------------------------- loading
def _format_loc(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for p in loc:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        else:
            name = "schema" if p == "schema_" else str(p)
            # An unknown key is named, but a long one cut short: it may be a secret pasted as a key.
            name = name if len(name) <= 40 else name[:39] + "…"
            parts.append(("." if parts else "") + name)
    return "".join(parts) or "<top level>"


def _unwrap(t: Any) -> Any:
    """``t`` without ``Annotated`` metadata and without ``| None``."""
    if get_origin(t) is Annotated:
        t = get_args(t)[0]
    if get_origin(t) in (Union, types.UnionType):
        t = next((a for a in get_args(t) if a is not type(None)), t)
    return t


def _known_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed in the mapping at ``loc`` of a file that ``model`` validates ([] if not a model)."""
    t: Any = model
    for part in loc:
        t = _unwrap(t)
        if isinstance(t, type) and issubclass(t, BaseModel):
            field = next((f for n, f in t.model_fields.items() if part in (n, f.alias)), None)
            if field is None:
                return []
            t = field.annotation
        elif get_origin(t) in (list, dict):
            t = get_args(t)[-1]  # the item type of a list, the value type of a dict
        else:
            return []
    t = _unwrap(t)
    if not (isinstance(t, type) and issubclass(t, BaseModel)):
        return []
    return [f.alias or n for n, f in t.model_fields.items()]


def _explain(path: Path, err: ValidationError, model: type[BaseModel]) -> ConfigError:
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        cause = e.get("ctx", {}).get("error")
        refusal = cause if isinstance(cause, _Refusal) else None
        key = _format_loc(loc + (refusal.at if refusal else ()))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            known = _known_keys(model, loc[:-1])
            msg = "unknown key; remove it or check the spelling"
            msg += f"; known keys: {', '.join(known)}" if known else ""
        elif e["type"] == "missing":
            msg = "required key is missing"
        got = e.get("input")
        # A value is echoed only where it helps and cannot be a secret, as the message ends up in run states
        # and logs. Never an unknown key's (a secret pasted under a wrong key, or a file that is no config at
        # all), never a *_env key's (a key pasted where the name of its variable belongs), never a whole
        # mapping or list, nor where the validator said not to.
        echo = (
            e["type"] not in ("missing", "extra_forbidden")
            and not isinstance(got, dict | list)
            and not (loc and str(loc[-1]).endswith("_env"))
            and (refusal is None or refusal.echo)
        )
        lines.append(f"{path}: key '{key}': {msg}" + (f" (got {_short(got)})" if echo else ""))
    return ConfigError("\n".join(lines))


class DuplicateKeyError(yaml.YAMLError):
    """A mapping in a YAML file gives one key twice."""

    def __init__(self, key: str, line: int, first_line: int) -> None:
        super().__init__(f"duplicate key '{key}' at line {line} (first at line {first_line})")
        self.key, self.line, self.first_line = key, line, first_line


class ConfLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a mapping key given twice, at any depth.

    Plain YAML keeps the last of two equal keys without a word, so a setting pasted twice (a new ``lr``
    above an old one, a second ``storage`` under a site) would silently win.
    """

    def construct_document(self, node: yaml.Node) -> Any:
        self._refuse_duplicate_keys(node)
        return super().construct_document(node)

    def _refuse_duplicate_keys(self, root: yaml.Node) -> None:
        todo: list[tuple[yaml.Node, tuple[str | int, ...]]] = [(root, ())]
        done: set[int] = set()
        while todo:
            node, at = todo.pop()
            if id(node) in done:  # an alias of a node already checked (or a recursive one)
                continue
            done.add(id(node))
            if isinstance(node, yaml.SequenceNode):
                todo.extend((item, (*at, i)) for i, item in enumerate(node.value))
            elif isinstance(node, yaml.MappingNode):
                first: dict[Any, int] = {}
                for key_node, value_node in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *base': its keys may be overridden
                        todo.append((value_node, at))
                        continue
                    if not isinstance(key_node, yaml.ScalarNode):
                        continue  # a mapping or list as a key: the constructor refuses it
                    # Compared as constructed, as the dict would: 'true' and 'True' are one key.
                    key = self.construct_object(key_node)
                    line = key_node.start_mark.line + 1
                    if key in first:
                        raise DuplicateKeyError(_format_loc((*at, str(key))), line, first[key])
                    first[key] = line
                    todo.append((value_node, (*at, str(key))))


def _yaml_problem(e: yaml.YAMLError) -> str:
    """Where and what, without PyYAML's excerpt of the file (the offending line could hold a secret)."""
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        mark = e.problem_mark
        context = f" ({e.context})" if e.context else ""
        return f"line {mark.line + 1}, column {mark.column + 1}: {e.problem}{context}"
    return type(e).__name__


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"{path}: file not found (expected a YAML file; see conf/ in the repository)")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=ConfLoader)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot be read as UTF-8 text ({type(e).__name__}); "
                          "point at a YAML file") from None
    except DuplicateKeyError as e:
        raise ConfigError(f"{path}: line {e.line}: key '{e.key}': duplicate key (first at line {e.first_line}); "
                          "YAML would silently keep only the last: remove or rename one of them") from None
    except yaml.YAMLError as e:
        # 'from None': the YAML error's own text quotes the file, and a traceback would carry it into logs.
        raise ConfigError(f"{path}: not valid YAML at {_yaml_problem(e)}; fix the syntax there") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _load(model: type[BaseModel], path: Path) -> Any:
    try:
        return model.model_validate(_read_yaml(path))
    except ValidationError as e:
        raise _explain(path, e, model) from None


def conf_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """The configuration directory: the argument, else ``$INSITU_CONF``, else ``./conf``."""
    return Path(path or os.environ.get("INSITU_CONF") or "conf")


def load_sites(path: str | os.PathLike[str] | None = None) -> SitesConfig:
    return _load(SitesConfig, Path(path) if path else conf_dir() / "sites.yaml")


def load_datasets(path: str | os.PathLike[str] | None = None, only: str | None = None) -> DatasetsConfig:
    """``datasets.yaml``; with ``only``, just that dataset is validated (when it is defined), so that a broken
    entry of another dataset does not stop a job on this one (``insitu validate`` checks them all)."""
    p = Path(path) if path else conf_dir() / "datasets.yaml"
    if only is None:
        return _load(DatasetsConfig, p)
    raw = _read_yaml(p)
    entries = raw.get("datasets") if isinstance(raw, dict) else None
    if isinstance(entries, dict) and only in entries:
        raw = {**raw, "datasets": {only: entries[only]}}
    try:
        return DatasetsConfig.model_validate(raw)
    except ValidationError as e:
        raise _explain(p, e, DatasetsConfig) from None


def load_training(path: str | os.PathLike[str]) -> TrainingConfig:
    return _load(TrainingConfig, Path(path))


class Conf(BaseModel):
    """Everything a job needs, cross-checked across files."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    sites: SitesConfig
    datasets: DatasetsConfig
    training: TrainingConfig
    dataset_name: str
    paths: dict[str, str]

    @property
    def dataset(self) -> DatasetConfig:
        return self.datasets.datasets[self.dataset_name]

    def task(self) -> TaskSpec:
        """The learning task of this training on this dataset (load_conf checked that they fit)."""
        from insitu.specs import build_task

        return build_task(self.training.task, self.dataset.schema_)

    def config_hash(self) -> str:
        """A stable hash of the effective configuration (for lineage tags)."""
        blob = json.dumps(
            {
                "sites": self.sites.model_dump(mode="json"),
                # When a dataset is retrained is no part of what a job computes: editing a schedule must not
                # stop a job from resuming.
                "dataset": self.dataset.model_dump(mode="json", by_alias=True, exclude={"schedules"}),
                "training": self.training.model_dump(mode="json"),
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def trusted_training(training: str, directory: str | os.PathLike[str] | None = None) -> str:
    """A run's ``training`` parameter, admitted only as the name of a config in this actor's ``conf/training/``.

    A flow's parameters come from whoever created the run: a path would make the site read (and report errors
    about) a file the caller chose. So only a plain name (:data:`CONF_NAME`: no ``/``, no ``..``, no suffix)
    of a file ``<conf>/training/<name>.yaml`` is admitted, and that file may not be a link out of the folder.

    Returns
    -------
    str
        The config's resolved path.

    Raises
    ------
    ConfigError
        For anything else; the message shows at most 40 characters of ``training``.
    """
    root = (conf_dir(directory) / "training").resolve()
    fix = f"give the name of a config there (e.g. 'fraud'), or add yours to {root}"
    if not isinstance(training, str) or not re.fullmatch(CONF_NAME, training):
        raise ConfigError(f"training {_short(training)}: only configs in {root} may be run, named without "
                          f"path or suffix ({CONF_NAME}); {fix}")
    path = (root / f"{training}.yaml").resolve()
    if path.parent != root:  # a symlink whose target lies elsewhere
        raise ConfigError(f"training {training!r}: only configs in {root} may be run, and "
                          f"{training}.yaml links out of it; copy the config there instead")
    if not path.is_file():
        known = sorted(p.stem for p in root.glob("*.yaml") if re.fullmatch(CONF_NAME, p.stem))
        raise ConfigError(f"training {training!r}: only configs in {root} may be run, and it holds no "
                          f"{training}.yaml (it holds {known}); {fix}")
    return str(path)


def load_conf(
    training: str | os.PathLike[str],
    dataset: str = "fraud",
    directory: str | os.PathLike[str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> Conf:
    """Load and cross-check sites, datasets and one training config.

    ``training`` is a name (``fraud``: ``<conf>/training/fraud.yaml``, admitted as by :func:`trusted_training`)
    or a path ending in ``.yaml``/``.yml``, read as given: a path is for the operator's own tools and tests,
    and a run's parameter must go through :func:`trusted_training` first. ``dataset`` is a key of
    ``datasets.yaml``. ``overrides`` are top-level training keys (e.g. ``{"rounds": 2}``) applied after loading.
    """
    d = conf_dir(directory)
    if isinstance(training, str) and not training.endswith((".yaml", ".yml")):
        trusted_training(training, d)  # a name: refused unless it names a file of conf/training/
        tpath = d / "training" / f"{training}.yaml"
    else:
        tpath = Path(training)
        if not tpath.is_absolute() and not tpath.exists() and (d.parent / tpath).exists():
            tpath = d.parent / tpath
    sites = load_sites(d / "sites.yaml")
    datasets = load_datasets(d / "datasets.yaml", only=dataset if isinstance(dataset, str) else None)
    if overrides:
        raw = _read_yaml(tpath)
        raw.update({k: v for k, v in overrides.items() if v is not None})
        try:
            train = TrainingConfig.model_validate(raw)
        except ValidationError as e:
            raise _explain(Path(f"{tpath} (with overrides {overrides})"), e, TrainingConfig) from None
    else:
        train = load_training(tpath)
    dpath = d / "datasets.yaml"
    if not isinstance(dataset, str) or not re.fullmatch(CONF_NAME, dataset):
        raise ConfigError(f"{dpath}: dataset {_short(dataset)}: a run names a dataset by its key in datasets.yaml "
                          f"({CONF_NAME}); defined: {sorted(datasets.datasets)}")
    if dataset not in datasets.datasets:
        raise ConfigError(
            f"{dpath}: key 'datasets.{dataset}': dataset not defined; defined: {sorted(datasets.datasets)} "
            "(name one of them, or add yours to datasets.yaml)"
        )
    ds = datasets.datasets[dataset]
    for i, shard in enumerate(ds.shards):
        if shard.site not in sites.names:
            raise ConfigError(
                f"{dpath}: key 'datasets.{dataset}.shards[{i}].site': unknown site {shard.site!r}; "
                f"sites.yaml defines {sites.names}"
            )
    _check_task(train, ds, tpath, dataset)
    with_data = {s.site for s in ds.shards}
    slow = [s for s in train.federation.simulated_delay_s if s not in sites.names]
    if slow:
        raise ConfigError(f"{tpath}: key 'federation.simulated_delay_s': unknown site(s) {slow}; sites.yaml "
                          f"defines {sites.names}")
    if train.federation.min_sites > len(with_data):
        raise ConfigError(
            f"{tpath}: key 'federation.min_sites': {train.federation.min_sites} exceeds the "
            f"{len(with_data)} sites holding shards of {dataset!r}; lower it to at most {len(with_data)}"
        )
    return Conf(
        sites=sites,
        datasets=datasets,
        training=train,
        dataset_name=dataset,
        paths={"sites": str(d / "sites.yaml"), "datasets": str(dpath), "training": str(tpath)},
    )


def _check_task(train: TrainingConfig, ds: DatasetConfig, tpath: Path, dataset: str) -> None:
    """The training's task fits the dataset's label, and its gate names a metric of that task."""
    from insitu.specs import build_task

    try:
        task = build_task(train.task, ds.schema_)
    except ValueError as e:
        raise ConfigError(f"{tpath}: key 'task': {e} in dataset {dataset!r}; choose the task that fits the label "
                          "(bool: binary, category: multiclass, float/int: regression)") from None
    named = (("gate.primary_metric", train.gate.primary_metric), ("validation.metric", train.validation.metric))
    for key, name in named:
        try:
            task.gate_metric(name)
        except ValueError as e:
            raise ConfigError(f"{tpath}: key '{key}': {e}; name one of them or leave it empty") from None
