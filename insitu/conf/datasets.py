"""``datasets.yaml``: each dataset's schema, its shards pinned to sites, and its recurring retraining."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from insitu.conf.errors import Refusal, did_you_mean, short
from insitu.conf.names import CONF_NAME
from insitu.conf.strict import Strict


class ColumnSpec(Strict):
    type: Literal["string", "float", "int", "bool", "category"]
    """the column's type; a row whose value does not parse is quarantined"""
    min: float | None = None
    """smallest valid value (rows below are quarantined)"""
    max: float | None = None
    """largest valid value (rows above are quarantined)"""
    values: list[str] | None = None
    """category: the allowed values (one-hot encoded in this order)"""
    nullable: bool = False
    """whether a missing value is allowed (strings and categories only)"""
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


class SchemaConfig(Strict):
    id: str
    """the column that identifies a row (it keys the split)"""
    label: str
    """the column to predict"""
    columns: Annotated[dict[str, ColumnSpec], Field(min_length=2)]
    """every column, by name"""

    @model_validator(mode="after")
    def _keys(self) -> SchemaConfig:
        for role in ("id", "label"):
            col = getattr(self, role)
            if col not in self.columns:
                raise ValueError(f"{role} column {col!r} is not among the columns{did_you_mean(col, self.columns)}: "
                                 f"{list(self.columns)}")
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
                raise Refusal(f"feature {name!r} of type {spec.type} is nullable, and insitu does not impute "
                               "missing numbers: fill them before `insitu data put`, or set nullable: false to "
                               "quarantine rows that lack it", at=("columns", name, "nullable"))
        return self

    @property
    def feature_columns(self) -> dict[str, ColumnSpec]:
        return {k: v for k, v in self.columns.items() if k not in (self.id, self.label)}


class ShardConfig(Strict):
    id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")]
    """the shard's name (unique in the dataset, ignoring case)"""
    site: str
    """the only site that may read this shard"""
    path: str
    """the file, relative to the site's storage URL (.parquet or .csv)"""

    @field_validator("path")
    @classmethod
    def _relative(cls, v: str) -> str:
        if "://" in v or v.startswith("/") or ".." in v.split("/"):
            raise ValueError("must be a path relative to the site's storage URL (no scheme, no leading /, no ..)")
        if not v.endswith((".parquet", ".csv")):
            raise ValueError("a shard is one .parquet or .csv file")
        return v


class ScheduleConfig(Strict):
    """One recurring ``retrain`` of the dataset it is declared in (``insitu deploy`` puts it on Prefect).

    Checked here without Prefect (the core never imports it): five cron fields and a time zone name.
    Prefect checks each field's values when the schedule is deployed; ``insitu validate`` asks it too.
    """

    cron: str = Field(description="minute hour day-of-month month day-of-week, e.g. '0 3 * * 1' (Mondays 03:00)")
    timezone: str = Field("UTC", description="IANA time zone the cron is read in, e.g. Europe/Berlin")
    training: Annotated[str, Field(pattern=CONF_NAME, description="a config of conf/training/, by name")]
    active: bool = True
    """false keeps the schedule deployed but paused"""

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


class DatasetConfig(Strict):
    description: str = ""
    """free text, shown in plans and the UI"""
    # Keys the deterministic train/val/test split. Fixed per dataset so that every job (whatever its
    # training seed) tests on the same rows: a champion is never scored on rows it trained on.
    split_key: int = 0
    """keys the deterministic train/val/test split of this dataset's rows (see docs/baselines.md)"""
    schema_: SchemaConfig = Field(alias="schema")
    """the columns every shard must have"""
    shards: Annotated[list[ShardConfig], Field(min_length=1)]
    """the dataset's files, each pinned to one site"""
    schedules: list[ScheduleConfig] = []
    """recurring retraining of this dataset (insitu deploy puts them on Prefect)"""

    @field_validator("schedules")
    @classmethod
    def _distinct(cls, schedules: list[ScheduleConfig]) -> list[ScheduleConfig]:
        # The same entry twice would start two identical jobs at every tick.
        first: dict[tuple[str, str, str], int] = {}
        for i, s in enumerate(schedules):
            key = (s.cron, s.timezone, s.training)
            if key in first:
                raise Refusal(f"repeats schedules[{first[key]}] (same cron, timezone and training); remove one",
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
                raise Refusal(f"shard ids must be unique, ignoring case: {s.id!r} repeats shards[{j}].id "
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


class DatasetsConfig(Strict):
    datasets: Annotated[dict[str, DatasetConfig], Field(min_length=1)]
    """one entry per dataset, by name"""

    @field_validator("datasets")
    @classmethod
    def _names(cls, datasets: dict[str, DatasetConfig]) -> dict[str, DatasetConfig]:
        # A run names its dataset by key, and only a CONF_NAME is admitted: any other key could never be run.
        for name in datasets:
            if not re.fullmatch(CONF_NAME, name):
                raise Refusal(f"dataset {short(name)} is not a plain name ({CONF_NAME}); rename it",
                               echo=False)
        return datasets
