"""Objective configuration (placeholder until the algorithm library lands)."""

from pydantic import BaseModel, ConfigDict


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class OPDConfig(_Section):
    enabled: bool = False
    """On-policy distillation with the teacher's per-token log-probs."""


class AlgoConfig(_Section):
    opd: OPDConfig = OPDConfig()
    """On-policy distillation."""
