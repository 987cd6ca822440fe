"""DAPO's dynamic sampling on the replica (`sampling.drop_uniform_groups`): a group whose rewards are all equal
has zero group-normalised advantage and is not worth a place in a batch."""

from __future__ import annotations

TOLERANCE = 1e-6
"""Rewards closer than this count as equal (a float reward computed two ways)."""


def is_uniform(rewards: list[float]) -> bool:
    """Every reward of the group is the same (within TOLERANCE): the group teaches nothing."""
    return bool(rewards) and max(rewards) - min(rewards) <= TOLERANCE
