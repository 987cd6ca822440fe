"""Length dynamics of a batch (seed: "Understanding Length Dynamics in RL Training"): the figures that tell
which of the post's causes is moving response length.

- Correct vs incorrect length (`length/correct_mean`, `length/incorrect_mean`): the aggregation bias of
  original GRPO shortens correct answers and lengthens incorrect ones; both growing together is not that bias.
- Easy vs hard prompts (`length/easy_mean`, `length/hard_mean`, `length/hard_frac`): the post's main driver,
  difficulty imbalance; a prompt is easy when its own group passes more than 90% of the time, hard below
  10% (the post's splits, measured on the group rather than on a fixed early checkpoint).
- Truncation (`length/truncated_frac`): responses cut at `max_new_tokens`; a rising share caps growth and
  feeds the incorrect side.
- How the loss aggregation weighs tokens (`length/token_weight_long_vs_short`,
  `length/token_weight_incorrect_vs_correct`): the mean weight a token of the longer half of the responses
  (of the incorrect ones) carries in the aggregated loss, relative to a token of the shorter half (of the correct
  ones). 1 under token-mean and seq-mean-token-sum; under seq-mean-token-mean a token of a response of length
  L weighs 1/L, so the ratio is the shorter set's mean length over the longer's: below 1 is the bias at work.
  Computed over the batch's trained sequences as one mini-batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from asyncrl.learner.algos.groups import Groups

EASY_PASS_RATE = 0.9
"""A prompt whose group passes more often than this is easy."""
HARD_PASS_RATE = 0.1
"""A prompt whose group passes less often than this is hard."""


def sequence_token_weight(lengths: Tensor, aggregation: str) -> Tensor:
    """[N]: the weight each token of a sequence of the given length carries in the aggregated loss, up to one
    constant common to the batch (token-mean 1/sum L, seq-mean-token-sum 1/G, seq-mean-token-mean 1/(G L_i))."""
    if aggregation in ("token-mean", "seq-mean-token-sum"):
        return torch.ones_like(lengths)
    if aggregation == "seq-mean-token-mean":
        return 1.0 / lengths.clamp_min(1)
    raise ValueError(f"unknown loss aggregation {aggregation!r}")


def _token_weight_ratio(lengths: Tensor, weight: Tensor, numerator: Tensor, denominator: Tensor) -> Tensor | None:
    """Mean per-token weight over the tokens of `numerator` sequences over that of `denominator` sequences
    (None when either holds no token)."""
    tokens_num, tokens_den = lengths[numerator].sum(), lengths[denominator].sum()
    if tokens_num <= 0 or tokens_den <= 0:
        return None
    mean_num = (lengths[numerator] * weight[numerator]).sum() / tokens_num
    mean_den = (lengths[denominator] * weight[denominator]).sum() / tokens_den
    return mean_num / mean_den


def length_dynamics(lengths: Tensor, correct: Tensor, groups: Groups, aggregation: str, *,
                    finished: Tensor | None = None, trained: Tensor | None = None) -> dict[str, Tensor]:
    """The batch's length figures (module doc). lengths [N] response tokens, correct [N] bool, `groups` the
    prompts; `finished` [N] bool (ended with EOS; None: not known, no truncation figure); `trained` [N] bool (the
    rows the loss sees, for the aggregation weights; None: all). A figure with no sequence to average over is
    left out rather than reported as 0."""
    if lengths.numel() == 0:
        return {}
    lengths = lengths.float()
    correct = correct.bool()
    out: dict[str, Tensor] = {}

    def mean_of(name: str, rows: Tensor) -> None:
        if rows.any():
            out[name] = lengths[rows].mean()

    mean_of("length/correct_mean", correct)
    mean_of("length/incorrect_mean", ~correct)
    pass_rate = groups.mean_per_sequence(correct.float())
    easy, hard = pass_rate > EASY_PASS_RATE, pass_rate < HARD_PASS_RATE
    mean_of("length/easy_mean", easy)
    mean_of("length/hard_mean", hard)
    out["length/easy_frac"] = easy.float().mean()
    out["length/hard_frac"] = hard.float().mean()
    if finished is not None:
        out["length/truncated_frac"] = (~finished.bool()).float().mean()

    rows = (lengths > 0) if trained is None else (lengths > 0) & trained.bool()
    weight = sequence_token_weight(lengths, aggregation)
    if rows.sum() >= 2:
        median = lengths[rows].median()
        longer = rows & (lengths > median)
        ratio = _token_weight_ratio(lengths, weight, longer, rows & ~longer)
        if ratio is not None:
            out["length/token_weight_long_vs_short"] = ratio
    ratio = _token_weight_ratio(lengths, weight, rows & ~correct, rows & correct)
    if ratio is not None:
        out["length/token_weight_incorrect_vs_correct"] = ratio
    return out
