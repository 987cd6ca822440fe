"""Training-free process rewards, the pure part (seed: "Implementing Training-Free Process Rewards"): a response
cut into episodes at discourse markers (with a token-length fallback), the value of each prefix as the mean
log-prob of the ground-truth answer after a force-answer prompt, V(prefix_k), and the marginal utility of
episode k, U_k = V(prefix_k) - V(prefix_{k-1}), as a reward on the episode's last token.

Prefix 0 is the empty response (the prompt alone); prefix k ends where episode k ends. The last episode, up to
the end of the response, is not scored here: the outcome reward covers it.

A multi-turn episode (an agent's) is cut at its turns instead (`turn_boundaries`): each model turn the
environment answered ends one, V is scored after the answer and the utility goes on the turn's last token."""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Sequence

SENTENCE_ENDS = (".", "?", "!", "\n")
"""A token whose text ends with one of these (trailing spaces aside) ends a sentence: where the length
fallback prefers to cut an over-long episode."""


def episode_ends(pieces: Sequence[str], markers: Sequence[str], max_tokens: int) -> list[int]:
    """Token indices at which an episode ends (exclusive), in order, each in (0, len(pieces)).

    `pieces`: the text of each response token. An episode ends right before a token at which a marker begins
    (its text starts there, or inside it); one longer than `max_tokens` is cut after the last sentence end
    within the limit, or at the limit when it has none."""
    text, starts = "", []
    for piece in pieces:
        starts.append(len(text))
        text += piece
    cuts: set[int] = set()
    for marker in markers:
        at = text.find(marker)
        while at != -1:
            token = bisect_right(starts, at) - 1  # the token whose text holds offset `at`
            if 0 < token < len(pieces):
                cuts.add(token)
            at = text.find(marker, at + 1)
    ends, last = [], 0
    for cut in sorted(cuts) + [len(pieces)]:
        while cut - last > max_tokens:
            last = _fallback_cut(pieces, last, max_tokens)
            if last < len(pieces):
                ends.append(last)
        if cut < len(pieces) and cut > last:
            ends.append(cut)
            last = cut
    return ends


def _fallback_cut(pieces: Sequence[str], start: int, max_tokens: int) -> int:
    """Where an episode from `start` longer than `max_tokens` ends: after the last token within the limit
    whose text ends a sentence, else at the limit."""
    for end in range(start + max_tokens, start, -1):
        if pieces[end - 1].rstrip(" ").endswith(SENTENCE_ENDS):
            return end
    return start + max_tokens


def turn_boundaries(turn_ends: Sequence[int], observation_starts: Sequence[int],
                    observation_ends: Sequence[int]) -> tuple[list[int], list[int]]:
    """(prefix ends, reward positions) of a multi-turn response: for each model turn an observation follows
    (it starts where the turn ends), V is scored after that observation, the state the turn's action led to,
    and the utility goes on the turn's last token (observations are not trained). The last turn, which nothing
    answers, is the outcome's."""
    answered = dict(zip(observation_starts, observation_ends))
    prefix_ends, positions = [], []
    for end in turn_ends:
        if end in answered:
            prefix_ends.append(answered[end])
            positions.append(end - 1)
    return prefix_ends, positions


def prefix_value(answer_logprobs: Sequence[float]) -> float:
    """V(prefix): the mean log-prob of the answer's tokens after the prefix and the force-answer prompt."""
    if not answer_logprobs:
        raise ValueError("V(prefix) needs the log-probs of at least one answer token")
    return sum(answer_logprobs) / len(answer_logprobs)


def marginal_utilities(values: Sequence[float]) -> list[float]:
    """U_k = V_k - V_{k-1} for k = 1..len(values)-1 (values[0]: the empty prefix)."""
    return [after - before for before, after in itertools.pairwise(values)]


def scoring_requests(prompt: Sequence[int], response: Sequence[int], ends: Sequence[int], force: Sequence[int],
                     answer: Sequence[int]) -> tuple[list[list[int]], list[int]]:
    """(sequences, answer starts) to score for V(prefix_0..m): prompt + response[:end] + force + answer, with
    the answer's first position, for the empty prefix and each episode end."""
    sequences, starts = [], []
    for end in (0, *ends):
        head = [*prompt, *response[:end], *force]
        sequences.append([*head, *answer])
        starts.append(len(head))
    return sequences, starts
