"""The base of every configuration model: unknown keys are mistakes, and a loaded config does not change."""

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
