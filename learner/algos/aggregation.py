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


def aggregate_loss(token_loss: Tensor, mask: Tensor, mode: str) -> Tensor:
    """Scalar loss from `token_loss` [N, T] over the bool `mask` [N, T] with the named aggregation."""
    dtype = token_loss.dtype
    if mode == "token-mean":
        return masked_sum(token_loss, mask) / mask.sum().clamp_min(1).to(dtype)
    per_sequence = masked_sum(token_loss, mask, dim=-1)
    lengths = mask.sum(dim=-1)
    sequences = (lengths > 0).sum().clamp_min(1).to(dtype)
    if mode == "seq-mean-token-sum":
        return per_sequence.sum() / sequences
    if mode == "seq-mean-token-mean":
        return (per_sequence / lengths.clamp_min(1).to(dtype)).sum() / sequences
    raise ValueError(f"unknown loss aggregation {mode!r}")
