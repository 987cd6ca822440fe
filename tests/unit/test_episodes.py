"""Process rewards, the pure part (rollout/episodes.py), against values worked out by hand."""

from __future__ import annotations

import pytest

from asyncrl.rollout.episodes import (
    episode_ends,
    marginal_utilities,
    prefix_value,
    scoring_requests,
)

PIECES = ["So", " x", "=", "2", ".", " Wait", ",", " no", ".", " So", " 3"]  # "So x=2. Wait, no. So 3"


def test_episodes_end_before_the_token_where_a_marker_begins():
    # "Wait," begins in token 5, "So " at offset 18 inside token 9 (" So"); the one at offset 0 cuts nothing.
    assert episode_ends(PIECES, ["Wait,", "So "], max_tokens=64) == [5, 9]
    assert episode_ends(PIECES, ["Hmm,"], max_tokens=64) == []


def test_an_episode_too_long_is_cut_after_its_last_sentence_end_or_at_the_limit():
    pieces = ["a", " b", " c.", " d", " e", " f", " g", " h", " i", " j"]
    assert episode_ends(pieces, [], max_tokens=4) == [3, 7]  # " c." ends a sentence; " d".." g" has none
    # With markers too: "Wait," at token 1 cuts there; tokens 1..9 are then cut by the length fallback.
    assert episode_ends(["x", " Wait,", *pieces[2:]], ["Wait,"], max_tokens=4) == [1, 3, 7]


def test_the_prefix_value_and_the_marginal_utilities():
    assert prefix_value([-1.0, -3.0]) == -2.0
    with pytest.raises(ValueError, match="at least one answer token"):
        prefix_value([])
    # V(empty) = -4, then -2.5, -3: episode 1 helped (+1.5), episode 2 hurt (-0.5).
    assert marginal_utilities([-4.0, -2.5, -3.0]) == [1.5, -0.5]


def test_the_sequences_scored_for_each_prefix():
    sequences, starts = scoring_requests([1, 2], [3, 4, 5], [2], force=[9], answer=[7, 8])
    assert sequences == [[1, 2, 9, 7, 8], [1, 2, 3, 4, 9, 7, 8]] and starts == [3, 5]
