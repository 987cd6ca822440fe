"""Per-token KL estimators from scalar log-probs of the sampled tokens (Schulman's k1/k2/k3).

With samples a ~ p and r = q(a) / p(a), each estimates KL(p || q):
    k1 = -log r                 (unbiased, signed, high variance)
    k2 = 0.5 (log r)^2          (biased, non-negative; the OPD blog's K2)
    k3 = r - 1 - log r          (unbiased, non-negative)
The same formulas serve three places: KL to the reference (p = pi, q = pi_ref), the rollout-correction
diagnostics KL(behav || prox) (p = pi_behav, q = pi_prox), and the K2/K3 rejection statistics.

KL as a loss has its own multi-epoch importance correction (seed: off-policy blog, "Source 1"): the penalty
enters the objective as -beta k, whose pessimistic clipped surrogate is min(u (-beta k), clip(u) (-beta k)),
i.e. the loss beta * max(u k, clip(u, 1-eps_low, 1+eps_high) k), with u = pi_theta / pi_prox carrying gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor


def kl_from_log_ratio(log_r: Tensor, estimator: str) -> Tensor:
    """Per-token estimate of KL(p || q) from log r = log q - log p (already clamped and masked)."""
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r.square()
    if estimator == "k3":
        return torch.expm1(log_r) - log_r  # r - 1 - log r, with expm1 for accuracy near r = 1
    raise ValueError(f"unknown KL estimator {estimator!r}")


def kl_to_reference(logp: Tensor, logp_ref: Tensor, mask: Tensor, estimator: str, clamp: float) -> Tensor:
    """Per-token KL(pi || pi_ref) estimate; differentiable in `logp`; 0 on padding."""
    log_r = torch.where(mask, logp_ref - logp, torch.zeros((), dtype=logp.dtype, device=logp.device))
    return kl_from_log_ratio(log_r.clamp(-clamp, clamp), estimator)


def importance_corrected_kl(kl: Tensor, ratio: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """max(u k, clip(u) k): the KL-as-loss term under a PPO-style clipped importance ratio u (with grad)."""
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    return torch.maximum(ratio * kl, clipped * kl)
