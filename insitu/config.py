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
from pathlib import Path
from typing import Annotated, Any, Literal

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

SITE_NAME = r"^[a-z][a-z0-9-]{0,30}$"
ENV_NAME = r"^[A-Z_][A-Z0-9_]*$"
KNOWN_MODELS = ("fraud_mlp",)
KNOWN_AGGREGATORS = ("fedavg",)
KNOWN_STRATEGIES = ("single", "ddp")


class ConfigError(ValueError):
    """A configuration file is missing, unparsable or invalid."""


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
        if not re.match(r"^(s3|file|memory|gs|abfs|az)://", v):
            raise ValueError("must be an fsspec URL such as s3://bucket/ or file:///abs/path")
        return v if v.endswith("/") else v + "/"


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

    @field_validator("sites")
    @classmethod
    def _unique(cls, sites: list[SiteConfig], info: ValidationInfo) -> list[SiteConfig]:
        for attr in ("name", "work_pool", "storage"):
            seen: set[str] = set()
            for s in sites:
                v = getattr(s, attr)
                if v in seen:
                    raise ValueError(f"two sites share {attr} {v!r}; give each site its own {attr}")
                seen.add(v)
        exchange = info.data.get("exchange")
        if exchange is not None:
            for s in sites:
                a, b = exchange.storage, s.storage
                if a.startswith(b) or b.startswith(a):
                    raise ValueError(
                        f"site {s.name!r} store {b} overlaps the exchange {a}; the exchange needs a "
                        "store of its own (rows could otherwise leak into it)"
                    )
        return sites

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

    @model_validator(mode="after")
    def _values(self) -> ColumnSpec:
        if self.type == "category" and not self.values:
            raise ValueError("a category column needs a non-empty 'values' list")
        if self.type != "category" and self.values is not None:
            raise ValueError("'values' is only allowed for type: category")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is greater than max ({self.max})")
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
        if self.columns[self.label].type != "bool":
            raise ValueError(f"label column {self.label!r} must have type: bool (binary label)")
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


class DatasetConfig(_Strict):
    description: str = ""
    # Keys the deterministic train/val/test split. Fixed per dataset so that every job (whatever its
    # training seed) tests on the same rows: a champion is never scored on rows it trained on.
    split_key: int = 0
    schema_: SchemaConfig = Field(alias="schema")
    shards: Annotated[list[ShardConfig], Field(min_length=1)]

    @field_validator("shards")
    @classmethod
    def _unique(cls, shards: list[ShardConfig]) -> list[ShardConfig]:
        ids = [s.id for s in shards]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise ValueError(f"shard ids must be unique; rename the repeated ones: {sorted(dup)}")
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


# --------------------------------------------------------------------------- training/*.yaml
class ModelConfig(_Strict):
    name: str = "fraud_mlp"
    hidden: Annotated[list[Annotated[int, Field(ge=1, le=65536)]], Field(min_length=1)] = [64, 32]
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.1

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in KNOWN_MODELS:
            raise ValueError(f"unknown model {v!r}; known: {list(KNOWN_MODELS)}")
        return v


class OptimizerConfig(_Strict):
    name: Literal["adam", "sgd", "adamw"] = "adam"
    lr: Annotated[float, Field(gt=0.0, le=10.0)] = 1e-3
    weight_decay: Annotated[float, Field(ge=0.0)] = 0.0
    momentum: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0


class FederationConfig(_Strict):
    min_sites: Annotated[int, Field(ge=1)] = 1
    round_deadline_s: Annotated[float, Field(gt=0)] = 180.0


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

    primary_metric: Literal["pr_auc", "roc_auc"] = "pr_auc"
    margin: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    max_site_drop: Annotated[float, Field(ge=0.0, le=1.0)] = 0.05
    absolute_floor: Annotated[float, Field(ge=0.0, le=1.0)] = 0.05


class RegistryConfig(_Strict):
    model_name: Annotated[str, Field(min_length=1)] = "insitu-fraud"


class TrainingConfig(_Strict):
    model: ModelConfig = ModelConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    rounds: Annotated[int, Field(ge=1, le=10000)] = 5
    local_epochs: Annotated[int, Field(ge=1, le=1000)] = 1
    batch_size: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    aggregator: str = "fedavg"
    seed: int = 0
    strategy: str = "single"
    ranks_per_site: Annotated[int, Field(ge=1, le=1024)] = 1
    federation: FederationConfig = FederationConfig()
    split: SplitConfig = SplitConfig()
    registry: RegistryConfig = RegistryConfig()
    gate: GateConfig = GateConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()

    @field_validator("aggregator")
    @classmethod
    def _agg(cls, v: str) -> str:
        if v not in KNOWN_AGGREGATORS:
            raise ValueError(f"unknown aggregator {v!r}; known: {list(KNOWN_AGGREGATORS)}")
        return v

    @field_validator("strategy")
    @classmethod
    def _strategy(cls, v: str) -> str:
        if v not in KNOWN_STRATEGIES:
            raise ValueError(f"unknown strategy {v!r}; known: {list(KNOWN_STRATEGIES)}")
        return v

    @field_validator("ranks_per_site")
    @classmethod
    def _ranks(cls, v: int, info: ValidationInfo) -> int:
        if info.data.get("strategy") == "single" and v != 1:
            raise ValueError("strategy 'single' runs one rank per site: set ranks_per_site: 1")
        return v


# --------------------------------------------------------------------------- loading
def _format_loc(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for p in loc:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        else:
            parts.append(("." if parts else "") + ("schema" if p == "schema_" else str(p)))
    return "".join(parts) or "<top level>"


def _explain(path: Path, err: ValidationError) -> ConfigError:
    lines = []
    for e in err.errors():
        key = _format_loc(tuple(e["loc"]))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key (remove it, or check its spelling)"
        elif e["type"] == "missing":
            msg = "required key is missing"
        got = e.get("input")
        # An unknown key's value is not echoed: the file may not be a config at all (a caller pointed at a
        # secret), and the message ends up in run states and logs.
        shown = "" if e["type"] in ("missing", "extra_forbidden") or isinstance(got, dict | list) \
            else f" (got {got!r})"
        lines.append(f"{path}: key '{key}': {msg}{shown}")
    return ConfigError("\n".join(lines))


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"{path}: file not found (expected a YAML file; see conf/ in the repository)")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _load(model: type[BaseModel], path: Path) -> Any:
    try:
        return model.model_validate(_read_yaml(path))
    except ValidationError as e:
        raise _explain(path, e) from None


def conf_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """The configuration directory: the argument, else ``$INSITU_CONF``, else ``./conf``."""
    return Path(path or os.environ.get("INSITU_CONF") or "conf")


def load_sites(path: str | os.PathLike[str] | None = None) -> SitesConfig:
    return _load(SitesConfig, Path(path) if path else conf_dir() / "sites.yaml")


def load_datasets(path: str | os.PathLike[str] | None = None) -> DatasetsConfig:
    return _load(DatasetsConfig, Path(path) if path else conf_dir() / "datasets.yaml")


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

    def config_hash(self) -> str:
        """A stable hash of the effective configuration (for lineage tags)."""
        blob = json.dumps(
            {
                "sites": self.sites.model_dump(mode="json"),
                "dataset": self.dataset.model_dump(mode="json", by_alias=True),
                "training": self.training.model_dump(mode="json"),
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def trusted_training(training: str, directory: str | os.PathLike[str] | None = None) -> str:
    """A run's ``training`` parameter, admitted only as a config of this actor's own ``conf/training/``.

    A flow's parameters come from whoever created the run: a path anywhere else would make the site read
    (and report errors about) a file the caller chose.

    Raises
    ------
    ConfigError
        When ``training`` names a file outside ``<conf>/training/``.
    """
    root = (conf_dir(directory) / "training").resolve()
    p = Path(training)
    candidate = (root / f"{training}.yaml") if not p.suffix and "/" not in training else p
    if not candidate.is_absolute():
        candidate = conf_dir(directory).parent / candidate
    if root not in candidate.resolve().parents:
        raise ConfigError(f"training {training!r}: only configs in {root} may be run (give its name, e.g. "
                          "'fraud'); add yours there")
    return str(candidate.resolve())


def load_conf(
    training: str | os.PathLike[str],
    dataset: str = "fraud",
    directory: str | os.PathLike[str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> Conf:
    """Load and cross-check sites, datasets and one training config.

    ``training`` is a path; a bare name (``fraud``) means ``<conf>/training/<name>.yaml``.
    ``overrides`` are top-level training keys (e.g. ``{"rounds": 2}``) applied after loading.
    """
    d = conf_dir(directory)
    tpath = Path(training)
    if not tpath.suffix:
        tpath = d / "training" / f"{training}.yaml"
    elif not tpath.is_absolute() and not tpath.exists() and (d.parent / tpath).exists():
        tpath = d.parent / tpath
    sites = load_sites(d / "sites.yaml")
    datasets = load_datasets(d / "datasets.yaml")
    if overrides:
        raw = _read_yaml(tpath)
        raw.update({k: v for k, v in overrides.items() if v is not None})
        try:
            train = TrainingConfig.model_validate(raw)
        except ValidationError as e:
            raise _explain(Path(f"{tpath} (with overrides {overrides})"), e) from None
    else:
        train = load_training(tpath)
    dpath = d / "datasets.yaml"
    if dataset not in datasets.datasets:
        raise ConfigError(
            f"{dpath}: key 'datasets.{dataset}': dataset not defined; defined: {sorted(datasets.datasets)}"
        )
    ds = datasets.datasets[dataset]
    for i, shard in enumerate(ds.shards):
        if shard.site not in sites.names:
            raise ConfigError(
                f"{dpath}: key 'datasets.{dataset}.shards[{i}].site': unknown site {shard.site!r}; "
                f"sites.yaml defines {sites.names}"
            )
    with_data = {s.site for s in ds.shards}
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
