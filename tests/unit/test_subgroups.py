"""A batch of leases of different sizes in one engine call (`rollout/subgroups.py`): a lease of m·G trajectories
is m requests of its prompt, seeded apart, joined back into one group in order."""

from __future__ import annotations

from types import SimpleNamespace

from asyncrl.core.determinism.seeds import derive_seed, sample_seed, subgroup_seed
from asyncrl.rollout.subgroups import SubGroups, lease_size


def test_a_larger_lease_is_asked_for_as_several_requests_and_joined_back_in_order():
    parts = SubGroups((2, 4, 2), group_size=2)
    assert parts.requests(["p", "hard", "q"]) == ["p", "hard", "hard", "q"]
    generated = [["p0", "p1"], ["h0", "h1"], ["h2", "h3"], ["q0", "q1"]]
    assert parts.join(generated) == [["p0", "p1"], ["h0", "h1", "h2", "h3"], ["q0", "q1"]]


def test_the_first_part_keeps_the_prompts_seed_and_the_others_are_seeded_apart():
    parts = SubGroups((2, 6), group_size=2)
    seeds = parts.seeds([11, 22])
    assert seeds == [11, 22, derive_seed(22, -1), derive_seed(22, -2)]
    assert subgroup_seed(22, 0) == 22  # a lease of G samples what it always did
    # No part's seed is a sample's seed of the same prompt (those derive from non-negative sample numbers).
    assert not set(seeds[2:]) & {sample_seed(22, j) for j in range(64)}
    assert parts.seeds(None) is None


def test_a_lease_without_a_size_is_the_size_asked_for():
    assert lease_size(SimpleNamespace(num_trajectories=0), 8) == 8  # a controller older than the field
    assert lease_size(SimpleNamespace(num_trajectories=16), 8) == 16
