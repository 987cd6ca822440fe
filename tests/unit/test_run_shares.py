"""Weighted fair shares of the replicas among runs (`asyncrl.core.engines.run_shares`), as tables: which run
each grant goes to (8 units of work each), given which runs ask."""

from __future__ import annotations

import pytest

from asyncrl.core.engines.run_shares import RunShares


def picks(shares: RunShares, rounds: list[set[str]]) -> str:
    """The runs picked, one letter per round (`.` when none), each granted one group."""
    out = []
    for admissible in rounds:
        run = shares.pick(admissible)
        out.append(run or ".")
        if run:
            shares.granted(run, 8)
    return "".join(out)


AB = {"a", "b"}


@pytest.mark.parametrize(("weights", "rounds", "expected"), [
    # equal weights, both always asking: turn by turn
    ({"a": 1, "b": 1}, [AB] * 6, "ababab"),
    # weights 3:1: three of every four leases go to a
    ({"a": 3, "b": 1}, [AB] * 8, "abaaabaa"),
    # b behind (not admissible): a takes every lease, no replica waits
    ({"a": 1, "b": 1}, [{"a"}] * 4, "aaaa"),
    # b back after lending its share: it does not claim the four it lent, turn by turn again
    ({"a": 1, "b": 1}, [{"a"}] * 4 + [AB] * 4, "aaaaabab"),
    # a alone, then a pause with nobody asking, then b comes back: level with where a stood, not four behind
    ({"a": 1, "b": 1}, [{"a"}] * 4 + [set()] + [{"b"}] + [AB] * 4, "aaaa.babab"),
    # nobody may take work
    ({"a": 1, "b": 1}, [set()] * 2, ".."),
    # a name no run has is ignored
    ({"a": 1}, [{"x"}, {"a", "x"}], ".a"),
])
def test_leases_go_by_weight_among_the_runs_that_may_take_one(weights, rounds, expected):
    assert picks(RunShares(weights), rounds) == expected


def test_a_run_added_mid_deployment_starts_level_with_the_others_and_a_removed_one_gets_nothing():
    shares = RunShares({"a": 1, "b": 1})
    assert picks(shares, [AB] * 10) == "ababababab"
    shares.add("c")  # starts at the floor: no catching up on the ten leases it was not there for
    assert picks(shares, [AB | {"c"}] * 6) == "abcabc"
    shares.remove("a")
    assert picks(shares, [AB | {"c"}] * 4) == "bcbc"
    assert shares.shares() == {"b": 0.5, "c": 0.5}


def test_bad_runs_are_refused_naming_the_run():
    shares = RunShares({"a": 1})
    with pytest.raises(ValueError, match="run 'a' is already sharing"):
        shares.add("a")
    with pytest.raises(ValueError, match="run 'b': weight must be > 0, got 0"):
        shares.add("b", 0)
