"""Loss aggregation: a per-token loss matrix [N, T] and a mask to one scalar (seed: the length-dynamics blog,
section "VeRL's Loss Aggregation").

- token-mean (DAPO): sum_{i,t} L_it / sum_i |y_i| -- every token weighs the same.
- seq-mean-token-sum (Dr.GRPO): (1/G) sum_i sum_t L_it -- no per-sequence length normalisation.
- seq-mean-token-mean (original GRPO): (1/G) sum_i (1/|y_i|) sum_t L_it -- tokens of short answers weigh more.

G counts the sequences that still have at least one valid token (rejected or empty rows do not dilute the
mean, matching token-mean, where they do not count either). Everything masked gives exactly 0, not NaN, and
the result stays connected to the graph so `backward()` works (with zero gradients).
"""

from __future__ import annotations

from torch import Tensor

from asyncrl.learner.algos.masked import masked_sum


def aggregation_units(mask: Tensor, mode: str) -> Tensor:
    """What `aggregate_loss` divides by: the valid tokens (token-mean) or the sequences with at least one
    (the seq-mean modes)."""
    if mode == "token-mean":
        return mask.sum()
    return (mask.sum(dim=-1) > 0).sum()


def aggregate_loss(token_loss: Tensor, mask: Tensor, mode: str, units: Tensor | None = None) -> Tensor:
    """Scalar loss from `token_loss` [N, T] over the bool `mask` [N, T] with the named aggregation.

    `units`: the denominator of a larger mini-batch these rows are a part of (`aggregation_units` of the
    whole); the parts' losses then add up to the whole's, and so do their gradients (micro-batches, ranks).
    """
    if mode not in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        raise ValueError(f"unknown loss aggregation {mode!r}")
    dtype = token_loss.dtype
    denominator = (aggregation_units(mask, mode) if units is None else units).clamp_min(1).to(dtype)
    if mode == "token-mean":
        return masked_sum(token_loss, mask) / denominator
    per_sequence = masked_sum(token_loss, mask, dim=-1)
    if mode == "seq-mean-token-sum":
        return per_sequence.sum() / denominator
    lengths = mask.sum(dim=-1)
    return (per_sequence / lengths.clamp_min(1).to(dtype)).sum() / denominator
