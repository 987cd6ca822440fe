"""The base of every config section of the one schema (`asyncrl.core.config`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Unknown keys are errors; field docstrings are the descriptions (`asyncrl config-docs`)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)
