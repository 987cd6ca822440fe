"""The base of every config section of the one schema (`asyncrl.core.config.schema`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class Section(BaseModel):
    """Unknown keys are errors; field docstrings are the descriptions (`asyncrl config-docs`)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


Cores = list[Annotated[int, Field(ge=0, le=4095)]]
"""CPU core numbers a process is pinned to (`os.sched_setaffinity` when it starts); empty = any core."""


class PinnedSection(Section):
    """The section of a role that runs as a process of its own: the cores it may be pinned to."""

    cpus: Cores = Field(default_factory=list)
    """CPU cores this process is pinned to when it starts (e.g. [0]); empty = any core. Pinning the learner and
    the rollouts to different cores stands in for separate accelerators on one machine."""
