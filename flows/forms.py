"""What a user may set when triggering a flow, and how it shows as a form in the Prefect UI."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from insitu.conf import JOB_ID_PATTERN


def in_declared_order(schema: dict[str, Any]) -> None:
    """Number a model's fields in the order they are declared (``json_schema_extra``): on PostgreSQL Prefect keeps
    the parameter schema as JSONB, which does not keep key order, and its UI orders a form's fields by ``position``
    (which Prefect sets for a flow's own parameters, not for a model's fields)."""
    for i, prop in enumerate(schema.get("properties", {}).values()):
        prop["position"] = i


class RetrainParams(BaseModel):
    """What a user may set when triggering ``retrain`` (shown as a form in the Prefect UI)."""

    model_config = ConfigDict(json_schema_extra=in_declared_order)

    training: str = Field("fraud", description="training config: a name in conf/training/")
    dataset: str = Field("fraud", description="dataset in conf/datasets.yaml")
    job_id: str | None = Field(None, pattern=JOB_ID_PATTERN,
                               description="reuse to resume a job; empty for a new one")
    rounds: int | None = Field(None, ge=1, le=1000, description="override the config's rounds")
    local_epochs: int | None = Field(None, ge=1, le=100, description="override the config's local epochs")
    batch_size: int | None = Field(None, ge=1, le=1_000_000, description="override the config's batch size")
    phase_timeout_s: float = Field(1800, gt=0, description="give up on a phase after this long")
    request: dict[str, Any] | None = Field(
        None, description="a job request signed by a principal (`insitu run --as NAME`); empty: use the standing "
                          "approval of this training and dataset (`insitu approve --as NAME`)")
