"""Rollout correction on the behaviour -> proximal gap (seed: `verl-rollout-correction-math.txt`; the
seq_sum_k3 mode and the one-sided seq_sum_k1 come from the TIM paper's appendix A.4).

Input is the per-token log-ratio log rho_t = log pi_prox - log pi_behav (decoupled) or
log pi_theta (detached) - log pi_behav (bypass), 0 on padding and not clamped: as in the seed, a per-token
quantity clamps each log rho_t to +-`log_ratio_clamp` (20) before it exponentiates, a sequence-level one sums
(or averages) the unclamped values and clamps only that total. Output:
- IS weights (detached): token w_t = min(rho_t, C); sequence w = min(prod_t rho_t, C); geometric
  w = min(exp(mean_t log rho_t), C); all computed in log space;
  optionally rescaled to mean 1 over the batch;
- a rejection mask: the response mask with rejected tokens / sequences removed;
- the per-token veto: a sequence with any rho_t below the veto threshold is rejected whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from asyncrl.core.algo.sections import RolloutCorrectionConfig
from asyncrl.learner.algos.kl import kl_from_log_ratio
from asyncrl.learner.algos.masked import masked_max, masked_mean, masked_sum


@dataclass
class Correction:
    weights: Tensor
    """[N, T] detached IS weights (1 where weights='none')."""
    mask: Tensor
    """[N, T] bool: the response mask after rejection and veto."""
    truncated: Tensor
    """[N, T] bool: valid tokens (before rejection) whose weight hit the cap C."""
    rejected_sequences: Tensor
    """[N] bool: sequences that lost all their tokens to rejection or veto."""
    vetoed_sequences: Tensor
    """[N] bool: sequences rejected by the per-token veto."""
    rejection_keep: Tensor
    """[N, T] bool: what the rejection criteria keep together (before the veto)."""
    criteria: list[tuple[str, Tensor]]
    """(mode, [N, T] bool keep) of each rejection criterion on its own, in config order."""
    norm_factor: Tensor
    """Scalar: the batch mean the weights were divided by (1 when not normalised)."""


def sequence_log_ratio(log_ratio: Tensor, mask: Tensor, clamp: float, mean: bool = False) -> Tensor:
    """[N]: log prod_t rho_t (or, with `mean`, its per-token mean) over the unclamped per-token values, then
    clamped to +-clamp: the seed clamps the sequence total, never its terms."""
    total = log_ratio.sum(dim=-1)  # padding holds 0, so this is the sum over valid tokens
    if mean:
        total = total / mask.sum(dim=-1).clamp_min(1)
    return total.clamp(-clamp, clamp)


def truncated_is_weights(log_ratio: Tensor, mask: Tensor, level: str, cap: float,
                         clamp: float = 20.0) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(weights, truncated) for level token / sequence / geometric / none."""
    log_cap = math.log(cap)
    if level == "none":
        return torch.ones_like(log_ratio), torch.zeros_like(mask)
    if level == "token":
        token = log_ratio.clamp(-clamp, clamp)
        truncated = (token > log_cap) & mask
        return torch.exp(token.clamp(max=log_cap)), truncated
    if level in ("sequence", "geometric"):
        seq_log = sequence_log_ratio(log_ratio, mask, clamp, mean=level == "geometric").unsqueeze(-1)
        truncated = (seq_log > log_cap) & mask
        return torch.exp(seq_log.clamp(max=log_cap)).expand_as(log_ratio), truncated
    raise ValueError(f"unknown IS weight level {level!r}")


def _bounds_keep(stat: Tensor, lower: float | None, upper: float | None) -> Tensor:
    """stat is a log-ratio; the bounds are ratios, compared in log space (no overflow)."""
    keep = torch.ones_like(stat, dtype=torch.bool)
    if lower is not None:
        keep &= stat >= math.log(lower)
    if upper is not None:
        keep &= stat <= math.log(upper)
    return keep


def rejection_keep(log_ratio: Tensor, mask: Tensor, mode: str, lower: float | None,
                   upper: float | None, clamp: float) -> Tensor:
    """[N, T] bool: True where the token survives the rejection mode (padding: True, masked elsewhere)."""
    if mode == "none":
        return torch.ones_like(mask)
    token = log_ratio.clamp(-clamp, clamp)
    if mode == "token_k1":
        return _bounds_keep(token, lower, upper)
    if mode in ("seq_sum_k1", "seq_mean_k1"):  # seq_mean_k1 is Geo-RS: the geometric mean ratio, length-invariant
        seq = sequence_log_ratio(log_ratio, mask, clamp, mean=mode == "seq_mean_k1")
        return _bounds_keep(seq, lower, upper).unsqueeze(-1).expand_as(mask)
    scope, family = mode.split("_", 1)[0], mode.rsplit("_", 1)[-1]  # token|seq, k2|k3
    per_token = kl_from_log_ratio(token, family)
    if scope == "token":
        return per_token <= upper
    if mode in ("seq_sum_k2", "seq_sum_k3"):
        stat = masked_sum(per_token, mask, dim=-1)
    elif mode in ("seq_mean_k2", "seq_mean_k3"):
        stat = masked_mean(per_token, mask, dim=-1)
    elif mode in ("seq_max_k2", "seq_max_k3"):
        stat = masked_max(per_token, mask, dim=-1)
    else:
        raise ValueError(f"unknown rejection mode {mode!r}")
    return (stat <= upper).unsqueeze(-1).expand_as(mask)


def veto_sequences(log_ratio: Tensor, mask: Tensor, threshold: float | None) -> Tensor:
    """[N] bool: sequences holding a valid token with rho_t < threshold."""
    if threshold is None:
        return torch.zeros(mask.shape[0], dtype=torch.bool, device=mask.device)
    return ((log_ratio < math.log(threshold)) & mask).any(dim=-1)


def normalize_weights(weights: Tensor, mask: Tensor, level: str) -> tuple[Tensor, Tensor]:
    """Rescale weights to mean 1: over valid tokens (token) or over sequences' mean weights (sequence)."""
    if level in ("sequence", "geometric"):
        has_tokens = mask.any(dim=-1)
        per_sequence = masked_mean(weights, mask, dim=-1)
        factor = masked_mean(per_sequence, has_tokens)
    else:
        factor = masked_mean(weights, mask)
    factor = torch.where(factor > 0, factor, torch.ones_like(factor))
    return weights / factor, factor


def apply_rollout_correction(log_ratio: Tensor, mask: Tensor, cfg: RolloutCorrectionConfig) -> Correction:
    """IS weights, rejection mask and veto for one (mini-)batch (`log_ratio` unclamped, 0 on padding);
    everything returned is detached."""
    log_ratio = log_ratio.detach()
    weights, truncated = truncated_is_weights(log_ratio, mask, cfg.weights, cfg.weight_cap, cfg.log_ratio_clamp)
    criteria = [
        (c.rejection, rejection_keep(log_ratio, mask, c.rejection, c.rejection_lower, c.rejection_upper,
                                     cfg.log_ratio_clamp))
        for c in [cfg, *cfg.more_rejections] if c.rejection != "none"
    ]  # fmt: skip
    keep = torch.ones_like(mask)
    for _mode, kept in criteria:
        keep = keep & kept
    vetoed = veto_sequences(log_ratio, mask, cfg.veto_threshold)
    final_mask = mask & keep & ~vetoed.unsqueeze(-1)
    rejected = mask.any(dim=-1) & ~final_mask.any(dim=-1)
    factor = torch.ones((), dtype=weights.dtype, device=weights.device)
    if cfg.batch_normalize and cfg.weights != "none":
        weights, factor = normalize_weights(weights, final_mask, cfg.weights)
    return Correction(weights=weights, mask=final_mask, truncated=truncated,
                      rejected_sequences=rejected, vetoed_sequences=vetoed, rejection_keep=keep, criteria=criteria,
                      norm_factor=factor)
