"""Advantage estimators on scalar rewards, the token-level-preserving variant and DASH gradient filtering.

Outcome estimators (one scalar reward R_i per sequence, groups = prompts):
- grpo:      (R_i - mean_g) / (std_g + eps), std with Bessel's correction as in GRPO/verl;
- drgrpo:    R_i - mean_g (Dr.GRPO drops the std division, which up-weights too-easy/too-hard prompts);
- rloo:      R_i - mean_{j != i, j in g} R_j = n/(n-1) (R_i - mean_g);
- reinforce: (R_i - mean_batch) / (std_batch + eps), batch whitening, groups ignored (TIM paper's REINFORCE).
A group of one has no baseline: it gets mean 0 and std 1 (verl's convention), i.e. A = R.

Token-level-preserving variant (seed: off-policy blog, "Token-Level Preserving Estimators" and its
"normalize reward types separately" pitfall): per-token process rewards p_it (e.g. a KL-in-reward penalty) are
standardised over all valid tokens of the same scope (group, or batch for reinforce; centred only for
drgrpo/rloo) and enter as reward-to-go, A_it = A_i^outcome + sum_{s >= t} p_hat_is, so the outcome reward and the
process rewards are normalised separately and per-token credit survives.

DASH (seed: `dash-effective-rl-reasoning-paper.txt`, section 3.5): drop sequences with small |A| before the
backward pass; with token-level advantages a sequence is dropped when max_t |A_it| < threshold.
"""

from __future__ import annotations

import torch
from torch import Tensor

from asyncrl.learner.algos.groups import Groups
from asyncrl.learner.algos.masked import as_bool_mask, masked_fill_zero, masked_max


def _finish_stats(mean: Tensor, square_deviation_sums: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
    """Bessel std from the sum of squared deviations; groups with fewer than two values get mean 0, std 1."""
    var = square_deviation_sums / (counts - 1).clamp_min(1)
    std = torch.where(counts > 1, var.sqrt(), torch.ones_like(var))
    return torch.where(counts > 1, mean, torch.zeros_like(mean)), std


def _scope(groups: Groups, estimator: str, num_sequences: int, device: torch.device) -> Groups:
    """Statistics run per prompt group, except batch whitening (reinforce), which pools the batch."""
    return Groups.whole_batch(num_sequences, device) if estimator == "reinforce" else groups


def outcome_advantages(rewards: Tensor, groups: Groups, estimator: str, eps: float) -> Tensor:
    """[N] advantages from scalar rewards."""
    if rewards.numel() == 0:
        return rewards
    scope = _scope(groups, estimator, rewards.shape[0], rewards.device)
    inverse = scope.inverse
    counts = scope.sizes(rewards.dtype)
    raw_mean = scope.sum(rewards) / counts.clamp_min(1)
    deviations = scope.sum((rewards - raw_mean[inverse]).square())  # two-pass: no cancellation
    mean, std = _finish_stats(raw_mean, deviations, counts)
    centred = rewards - mean[inverse]
    if estimator in ("grpo", "reinforce"):
        return centred / (std[inverse] + eps)
    if estimator == "drgrpo":
        return centred
    if estimator == "rloo":
        n = counts[inverse]
        return torch.where(n > 1, centred * n / (n - 1).clamp_min(1), rewards)
    raise ValueError(f"unknown advantage estimator {estimator!r}")


def process_advantages(token_rewards: Tensor, mask: Tensor, groups: Groups, estimator: str,
                       eps: float, where: Tensor | None = None) -> Tensor:
    """[N, T] reward-to-go of per-token rewards standardised over their scope's valid tokens; with `where`
    ([N, T] bool), over those positions alone, every other token's reward staying 0 (process rewards at episode
    ends, normalised on their own as the seed prescribes)."""
    if token_rewards.numel() == 0:
        return token_rewards
    if where is not None:
        mask = as_bool_mask(mask) & where.bool()
    scope = _scope(groups, estimator, token_rewards.shape[0], token_rewards.device)
    inverse = scope.inverse
    values = masked_fill_zero(token_rewards, mask)
    counts = scope.sum(mask.sum(dim=-1).to(values.dtype))
    raw_mean = scope.sum(values.sum(dim=-1)) / counts.clamp_min(1)
    row_deviations = masked_fill_zero((values - raw_mean[inverse].unsqueeze(-1)).square(), mask).sum(dim=-1)
    mean, std = _finish_stats(raw_mean, scope.sum(row_deviations), counts)
    centred = values - mean[inverse].unsqueeze(-1)
    if estimator in ("grpo", "reinforce"):
        centred = centred / (std[inverse].unsqueeze(-1) + eps)
    normalized = masked_fill_zero(centred, mask)
    return torch.flip(torch.cumsum(torch.flip(normalized, dims=[-1]), dim=-1), dims=[-1])


def dash_keep(advantages: Tensor, mask: Tensor, threshold: float | None) -> Tensor:
    """[N] bool: sequences DASH keeps (max_t |A_t| >= threshold); all True when the filter is off."""
    if threshold is None:
        return torch.ones(advantages.shape[0], dtype=torch.bool, device=advantages.device)
    return masked_max(advantages.abs(), mask, dim=-1) >= threshold
