"""Per-token policy surrogates (the quantity to *maximise*; the loss is -w * surrogate).

Decoupled PPO (seed: off-policy blog "Correction: Decoupled PPO"; design brief):
    u_t = exp(logp - logp_prox)            (with gradient)
    s_t = min(u_t A_t, clip(u_t, 1 - eps_low, 1 + eps_high) A_t)
    dual clip (A_t < 0 only): s_t = max(s_t, c A_t), c > 1, so a huge ratio on a bad token cannot produce an
    unbounded loss.
With prox == behav and IS weight 1 this is exactly PPO. In bypass mode logp_prox = logp_behav, so u_t is the
rollout ratio pi_theta / pi_behav and the clip is centred on the behaviour policy.

GSPO (sequence-level, the off-policy blog's Source 4 alternative to routing replay):
    s_i = exp(mean_t (logp - logp_prox))   (with gradient through every token of sequence i)
    o_i = min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i), A_i the sequence's advantage,
broadcast to the sequence's tokens, so every aggregation averages it like a per-token objective.

GSPO-token (the GSPO paper's token-level variant, for token-level advantages):
    s_it = sg(s_i) * exp(logp_t - sg(logp_t))   (value s_i; gradient s_i * grad logp_t, token t's own)
    o_it = min(s_it A_it, clip(s_it, 1 - eps_low, 1 + eps_high) A_it), A_it the token's advantage.
With one advantage per sequence its gradient under seq-mean-token-mean equals GSPO's.

REINFORCE with detached IS weights (verl seed, section "Policy Gradient Loss with Bypass Mode"):
    s_t = A_t * log pi_theta(a_t);  loss = -sg(w_t) s_t, so grad = -w_t A_t grad log pi_theta.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from asyncrl.learner.algos.masked import clamped_log_ratio, masked_fill_zero


@dataclass
class Surrogate:
    objective: Tensor
    """[N, T] per-token surrogate to maximise (with gradient), 0 on padding."""
    ratio: Tensor
    """[N, T] u_t = pi_theta / pi_prox (with gradient), 1 on padding."""
    clipped: Tensor
    """[N, T] bool: the clip is active (the token's gradient is zero because of it)."""
    dual_clipped: Tensor
    """[N, T] bool: the dual clip c * A is active."""


def ppo_clip_surrogate(logp: Tensor, logp_prox: Tensor, advantages: Tensor, mask: Tensor, eps_low: float,
                       eps_high: float, dual_clip_c: float | None, clamp: float) -> Surrogate:
    ratio = torch.exp(clamped_log_ratio(logp, logp_prox.detach(), mask, clamp))
    advantages = masked_fill_zero(advantages, mask)
    unclipped = ratio * advantages
    clipped_ratio = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    objective = torch.minimum(unclipped, clipped_ratio * advantages)
    with torch.no_grad():
        clipped = mask & (((ratio > 1.0 + eps_high) & (advantages > 0)) | ((ratio < 1.0 - eps_low) & (advantages < 0)))
    dual_clipped = torch.zeros_like(mask)
    if dual_clip_c is not None:
        floor = dual_clip_c * advantages
        with torch.no_grad():
            dual_clipped = mask & (advantages < 0) & (objective < floor)
        objective = torch.where(advantages < 0, torch.maximum(objective, floor), objective)
    return Surrogate(objective=masked_fill_zero(objective, mask), ratio=ratio, clipped=clipped,
                     dual_clipped=dual_clipped)


def gspo_surrogate(logp: Tensor, logp_prox: Tensor, advantages: Tensor, mask: Tensor, eps_low: float,
                   eps_high: float, clamp: float) -> Surrogate:  # fmt: skip
    log_ratio = clamped_log_ratio(logp, logp_prox.detach(), mask, clamp)
    maskf = mask.to(log_ratio.dtype)
    lengths = maskf.sum(dim=-1, keepdim=True).clamp_min(1)
    seq_ratio = torch.exp((log_ratio * maskf).sum(dim=-1, keepdim=True) / lengths)  # [N, 1]
    seq_adv = (masked_fill_zero(advantages, mask) * maskf).sum(dim=-1, keepdim=True) / lengths
    objective = torch.minimum(seq_ratio * seq_adv, seq_ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * seq_adv)
    with torch.no_grad():
        clipped = ((seq_ratio > 1.0 + eps_high) & (seq_adv > 0)) | ((seq_ratio < 1.0 - eps_low) & (seq_adv < 0))
    ratio = seq_ratio.expand_as(log_ratio)
    return Surrogate(objective=masked_fill_zero(objective.expand_as(log_ratio), mask),
                     ratio=torch.where(mask, ratio, torch.ones_like(ratio)), clipped=mask & clipped,
                     dual_clipped=torch.zeros_like(mask))  # fmt: skip


def gspo_token_surrogate(logp: Tensor, logp_prox: Tensor, advantages: Tensor, mask: Tensor, eps_low: float,
                         eps_high: float, clamp: float) -> Surrogate:  # fmt: skip
    log_ratio = clamped_log_ratio(logp, logp_prox.detach(), mask, clamp)
    maskf = mask.to(log_ratio.dtype)
    lengths = maskf.sum(dim=-1, keepdim=True).clamp_min(1)
    seq_ratio = torch.exp((log_ratio.detach() * maskf).sum(dim=-1, keepdim=True) / lengths)  # [N, 1], sg
    logp_masked = masked_fill_zero(logp, mask)
    ratio = seq_ratio * torch.exp(logp_masked - logp_masked.detach())  # value s_i, gradient per token
    advantages = masked_fill_zero(advantages, mask)
    objective = torch.minimum(ratio * advantages, ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages)
    with torch.no_grad():
        clipped = mask & (((ratio > 1.0 + eps_high) & (advantages > 0)) | ((ratio < 1.0 - eps_low) & (advantages < 0)))
    return Surrogate(objective=masked_fill_zero(objective, mask), ratio=torch.where(mask, ratio, torch.ones_like(ratio)),
                     clipped=clipped, dual_clipped=torch.zeros_like(mask))  # fmt: skip


def reinforce_surrogate(logp: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """A_t * log pi_theta(a_t) on valid tokens (with gradient through logp only).

    Both factors are masked before the product: a NaN advantage on padding times a zero upstream gradient
    would still be NaN in backward."""
    return masked_fill_zero(advantages.detach(), mask) * masked_fill_zero(logp, mask)
