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

_TEACHER_HINT = " (one teacher log-prob per response token: the Teacher's Score RPC returns exactly that)"


def check_teacher_alignment(logp_teacher: Tensor | None, response_mask: Tensor) -> None:
    """ValueError unless logp_teacher is given and [N, T] like the response mask."""
    if logp_teacher is None:
        raise ValueError("OPD is enabled but logp_teacher is None: the teacher must annotate the batch")
    check_token_tensor("logp_teacher", logp_teacher, response_mask, _TEACHER_HINT)


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
