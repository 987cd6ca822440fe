"""Batches of exactly B trajectories from groups of different sizes (`learner/batch_fill.py`), checked against
picks worked out by hand: the shortest prefix that holds an exact batch, the earliest groups within it."""

from __future__ import annotations

import itertools
import random

import pytest

from asyncrl.learner.batch_fill import pick


@pytest.mark.parametrize(("sizes", "total", "expected"), [
    ([8] * 10, 64, list(range(8))),  # one size: the first B / G groups, as always
    ([16] * 5, 64, [0, 1, 2, 3]),
    ([8, 16, 16, 16, 16], 64, [1, 2, 3, 4]),  # 8 + 16·3 = 56 leaves 8: only the four 16s make 64
    ([16, 8, 16, 8, 16], 64, [0, 1, 2, 3, 4]),
    ([16, 16, 16, 8, 8, 8], 64, [0, 1, 2, 3, 4]),
    ([8, 16, 8, 16, 16, 16], 32, [0, 1, 2]),  # 8 + 16 + 8: the first three
    ([16, 16, 8, 16], 40, [0, 1, 2]),
    ([16, 16, 16], 64, None),  # 48 held: no batch yet
    ([], 64, None),
    ([8], 0, []),
])  # fmt: skip
def test_the_pick_is_the_shortest_prefix_and_its_earliest_groups(sizes, total, expected):
    assert pick(sizes, total) == expected


def test_whenever_groups_of_g_and_of_a_multiple_dividing_b_hold_b_a_batch_is_found():
    """The load-time rule (hard_group_size a multiple of G dividing B) is what makes the batches always whole:
    every mix of 8s and 16s (and of 8s and 32s) holding 64 or more yields exactly 64, from its earliest groups."""
    rng = random.Random(0)
    for hard in (16, 32):
        for _ in range(2000):
            sizes = [rng.choice((8, hard)) for _ in range(rng.randint(1, 12))]
            chosen = pick(sizes, 64)
            assert (chosen is not None) == (sum(sizes) >= 64), sizes
            if chosen is not None:
                assert sum(sizes[i] for i in chosen) == 64
                shortest = min(n for n in range(1, len(sizes) + 1) if any(
                    sum(c) == 64 for r in range(n + 1) for c in itertools.combinations(sizes[:n], r)))
                assert max(chosen) == shortest - 1, sizes
