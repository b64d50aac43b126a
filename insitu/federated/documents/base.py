"""The base of every exchange document and the bounded value types they are made of.

Schemas forbid unknown keys, bound every string, list and mapping, and type every value, so that no row
fits in them: no free-form lists of records, no columns, no long strings.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from insitu.conf import SITE_NAME

MAX_SITES = 256  # sites a job may have (bench/coordinator_scale.py measures a round at 256)
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
FlowRunId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")]
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
