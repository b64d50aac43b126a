"""The base of every configuration model: unknown keys are mistakes, and a loaded config does not change."""

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    # Attribute docstrings are the fields' descriptions (docs/configuration.md is generated from them).
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
