"""The levels of `model.determinism`, each including the one before it.

- off: the fastest kernels; sampling draws from one generator per engine.
- reproducible: the same config and seed give the same run. Each sample's randomness comes from what is
  sampled (the prompt's stream position and the sample's index), never from which replica or batch it lands
  in, and the engines' forwards are batch invariant (a prompt's numbers do not depend on what it was batched
  with). The learner trains each batch in a canonical order with its usual kernels.
- bitwise: reproducible, and the learner's forwards run on the same batch-invariant computations as the
  engines', so every log-prob the learner recomputes equals the one the engine sampled with, bit for bit.
"""

from __future__ import annotations

from typing import Literal

Determinism = Literal["off", "reproducible", "bitwise"]
LEVELS: tuple[str, ...] = ("off", "reproducible", "bitwise")


def at_least(mode: str, level: str) -> bool:
    """Whether `mode` includes `level` (e.g. bitwise includes reproducible)."""
    return LEVELS.index(mode) >= LEVELS.index(level)


def seeded_sampling(mode: str) -> bool:
    """Samples draw from seeds of their own (prompt position, sample index)."""
    return at_least(mode, "reproducible")


def invariant_engines(mode: str) -> bool:
    """The engines' forwards are batch invariant."""
    return at_least(mode, "reproducible")


def invariant_learner(mode: str) -> bool:
    """The learner's forwards run on the engines' batch-invariant computations."""
    return at_least(mode, "bitwise")
