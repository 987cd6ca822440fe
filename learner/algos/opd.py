"""On-policy distillation with the teacher's scalar per-token log-probs (seed: off-policy blog, "Implementing
On-Policy Distillation"). The teacher scores the student's own sampled tokens; no vocabulary distribution.

- Eligibility: a prompt is hard when its group's pass rate is below a threshold; only *failed* rollouts of hard
  prompts get teacher guidance.
- Horizon: only the first K response tokens (early tokens steer the reasoning most).
- KL as advantage (K1): A_t = -(logp - logp_teacher) = logp_teacher - logp, replacing the RL advantage of the
  eligible sequences; normalised over the OPD tokens only, separately from the RL advantages.
- KL as loss (K2): beta * 0.5 (logp - logp_teacher)^2 on the OPD tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from asyncrl.learner.algos.masked import check_token_tensor, masked_fill_zero, masked_mean

_TEACHER_HINT = " (slice the teacher's full-sequence output to the response, e.g. with teacher_response_logprobs)"


def check_teacher_alignment(logp_teacher: Tensor | None, response_mask: Tensor) -> None:
    """ValueError unless logp_teacher is given and [N, T] like the response mask."""
    if logp_teacher is None:
        raise ValueError("OPD is enabled but logp_teacher is None: the teacher must annotate the batch")
    check_token_tensor("logp_teacher", logp_teacher, response_mask, _TEACHER_HINT)


def teacher_response_logprobs(full_logprobs: Tensor, response_starts: Tensor, width: int) -> Tensor:
    """Cut per-position teacher log-probs over prompt+response [N, L] to the response window [N, width].

    `full_logprobs[i, p]` is the log-prob of token p of sequence i; its response starts at response_starts[i].
    Positions past the end of a row come back as 0 (they are padding under the response mask).
    """
    n, length = full_logprobs.shape
    if response_starts.shape != (n,):
        raise ValueError(f"response_starts has shape {tuple(response_starts.shape)}; expected [{n}]")
    cols = response_starts.view(-1, 1) + torch.arange(width, device=full_logprobs.device).view(1, -1)
    inside = cols < length
    gathered = full_logprobs.gather(1, cols.clamp(max=length - 1))
    return torch.where(inside, gathered, torch.zeros((), dtype=full_logprobs.dtype, device=full_logprobs.device))


def eligible_sequences(success: Tensor, pass_rate: Tensor, pass_rate_threshold: float) -> Tensor:
    """[N] bool: failed rollouts of prompts whose pass rate ([N], per sequence) is below the threshold."""
    return ~success & (pass_rate < pass_rate_threshold)


def horizon_mask(mask: Tensor, horizon: int | None) -> Tensor:
    """[N, T] bool: the first `horizon` valid response tokens of each row (all of them when None)."""
    if horizon is None:
        return mask
    return mask & (torch.cumsum(mask.to(torch.int32), dim=-1) <= horizon)


def opd_advantages(logp_student: Tensor, logp_teacher: Tensor, opd_mask: Tensor, normalize: bool,
                   eps: float, clamp: float) -> Tensor:
    """[N, T]: -(logp_student - logp_teacher) on OPD tokens, optionally standardised over those tokens only."""
    gap = masked_fill_zero(logp_teacher - logp_student.detach(), opd_mask).clamp(-clamp, clamp)
    if not normalize:
        return gap
    count = opd_mask.sum()
    mean = masked_mean(gap, opd_mask)
    var = masked_fill_zero((gap - mean).square(), opd_mask).sum() / (count - 1).clamp_min(1)
    std = torch.where(count > 1, var.sqrt(), torch.ones_like(var))
    return masked_fill_zero((gap - mean) / (std + eps), opd_mask)


def opd_k2_loss(logp: Tensor, logp_teacher: Tensor, opd_mask: Tensor, clamp: float) -> Tensor:
    """[N, T]: 0.5 (logp - logp_teacher)^2 on OPD tokens (gradient through logp), 0 elsewhere."""
    diff = masked_fill_zero(logp - logp_teacher.detach(), opd_mask).clamp(-clamp, clamp)
    return 0.5 * diff.square()
