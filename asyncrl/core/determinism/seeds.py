"""Sampling seeds derived from what is sampled, so a sample's randomness does not depend on which replica
generates it, what it is batched with, or when.

A prompt's seed comes from the run's seed and the prompt's position in the controller's stream (its lease's
`prompt_index`); sample j of a group, and turn t of a multi-turn episode, get seeds derived from it. Each is
a 63-bit integer from a keyed hash, so nearby positions give unrelated streams.
"""

from __future__ import annotations

import hashlib


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers (the same integers give the same seed on every machine)."""
    digest = hashlib.blake2b(b",".join(str(int(p)).encode() for p in parts), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def prompt_seed(run_seed: int, prompt_position: int) -> int:
    """The seed of the prompt at `prompt_position` in the run's stream."""
    return derive_seed(run_seed, prompt_position)


def sample_seed(prompt: int, sample: int) -> int:
    """The seed of sample `sample` of the group of the prompt seeded `prompt`."""
    return derive_seed(prompt, sample)


def subgroup_seed(prompt: int, part: int) -> int:
    """The seed of part `part` of a group generated as several requests of its prompt (a hard prompt's larger
    group, `controller.difficulty.hard_group_size`): part 0 is the prompt's own seed, so a group of one part
    samples what it always did; the others are derived apart from every `sample_seed`."""
    return prompt if part == 0 else derive_seed(prompt, -part)
