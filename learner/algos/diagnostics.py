"""Per-step diagnostics (seed formulas: verl "Off-Policy Diagnostic Metrics"; TIM paper eq. 1 and 5).

Every function returns 0-dim tensors; `to_floats` turns the whole dict into Python floats with one
device->host copy (one sync on GPU instead of one per metric). Metric names are listed in docs/algorithms.md.
rho_t is the correction ratio (pi_prox / pi_behav, or pi_theta / pi_behav in bypass mode); delta_t = log rho_t.
"""

from __future__ import annotations

import torch
from torch import Tensor

from asyncrl.learner.algos.masked import masked_max, masked_mean, masked_min
from asyncrl.learner.algos.rollout_correction import Correction

_QUANTILES = (0.01, 0.5, 0.9, 0.99)


def to_floats(metrics: dict[str, Tensor]) -> dict[str, float]:
    """0-dim tensors -> floats in one stack and one copy; NaN (empty selections) -> 0, inf -> float32 max."""
    if not metrics:
        return {}
    values = torch.stack([v.reshape(()) for v in metrics.values()]).detach().float()
    values = torch.nan_to_num(values, nan=0.0, posinf=torch.finfo(torch.float32).max)
    return dict(zip(metrics.keys(), values.cpu().tolist()))


def _fraction(part: Tensor, whole: Tensor) -> Tensor:
    return part.sum().float() / whole.sum().clamp_min(1).float()


def _ess(values: Tensor, maskf: Tensor) -> Tensor:
    """Normalised effective sample size (sum w)^2 / (n sum w^2), in (0, 1]; 1 when all weights are equal."""
    v = values * maskf
    return v.sum().square() / (maskf.sum().clamp_min(1) * v.square().sum()).clamp_min(1e-30)


def masked_quantiles(rows: Tensor, valid: Tensor, quantiles: tuple[float, ...]) -> Tensor:
    """[K, Q]: linear-interpolated quantiles (torch.quantile's default) of each row [K, M] over its `valid`
    entries ([K, M] bool). One sort, indices computed on the device (no host sync); 0 where nothing is valid."""
    if rows.shape[-1] == 0:
        return rows.new_zeros((rows.shape[0], len(quantiles)))
    count = valid.sum(dim=-1, keepdim=True)
    ordered = torch.where(valid, rows, torch.full_like(rows, float("inf"))).sort(dim=-1).values
    q = torch.tensor(quantiles, dtype=rows.dtype, device=rows.device).view(1, -1)
    position = q * (count - 1).clamp_min(0).to(rows.dtype)
    low = position.floor().long()
    below, above = ordered.gather(1, low), ordered.gather(1, position.ceil().long())
    result = below + (above - below) * (position - low)
    return torch.where(count > 0, result, torch.zeros_like(result))


def _percentiles(named: dict[str, tuple[Tensor, Tensor]]) -> dict[str, Tensor]:
    """p1/p50/p90/p99 of each named (values [N, T], mask [N, T]) pair over its mask."""
    rows = torch.stack([values.reshape(-1) for values, _ in named.values()])
    valid = torch.stack([mask.reshape(-1) for _, mask in named.values()])
    table = masked_quantiles(rows, valid, _QUANTILES)
    return {f"{name}_p{round(q * 100)}": table[j, i] for j, name in enumerate(named)
            for i, q in enumerate(_QUANTILES)}


def _seq_log_mean_exp(values: Tensor, has: Tensor) -> Tensor:
    """log( mean over sequences with tokens of exp(values) ), without overflow."""
    masked = torch.where(has, values, torch.full_like(values, float("-inf")))
    return torch.logsumexp(masked, dim=0) - torch.log(has.sum().clamp_min(1).to(values.dtype))


def perplexity_diagnostics(logp_target: Tensor, logp_behav: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Training (target policy) and rollout perplexity: per sequence exp(-mean_t log p), averaged over
    sequences; the log-perplexities (mean_t -log p, averaged) and the differences training - rollout."""
    maskf = mask.to(logp_target.dtype)
    has = mask.any(dim=-1)
    lengths = maskf.sum(dim=-1).clamp_min(1)
    out = {}
    log_ppl = {}
    for name, logp in (("train", logp_target), ("rollout", logp_behav)):
        seq_nll = -(logp * maskf).sum(dim=-1) / lengths
        log_ppl[name] = masked_mean(seq_nll, has)
        out[f"rc/{name}_log_ppl"] = log_ppl[name]
        out[f"rc/{name}_ppl"] = masked_mean(torch.exp(seq_nll), has)
    out["rc/log_ppl_diff"] = log_ppl["train"] - log_ppl["rollout"]
    out["rc/ppl_diff"] = out["rc/train_ppl"] - out["rc/rollout_ppl"]
    return out


def rollout_diagnostics(log_ratio: Tensor, mask: Tensor, corr: Correction, cap: float,
                        clamp: float = 20.0) -> dict[str, Tensor]:  # fmt: skip
    """KL(behav || prox) K1/K3, PPL ratio, chi^2, ESS, delta stats, masked/truncated fractions, weights.

    `log_ratio` is log rho_t, 0 on padding and not clamped. As the seed computes them: the KL estimators, the
    PPL ratio and the delta statistics take it as it is (in float64, where the K3 term and the PPL ratio
    exponentiate); every token ratio rho_t (chi^2_token, ESS, ratio extremes and percentiles) clamps its log to
    +-`clamp`; chi^2_seq clamps each sequence's total, never its terms. `rc/chi2_seq_log` is
    log E[(prod_t rho_t)^2] with no clamp at all, from log-sum-exps: finite however biased the batch, where
    chi^2_seq itself saturates (exp(40)). ESS_seq and the sequence log-ratio statistics use the unclamped sums.
    `cap`: the IS cap C, for the ESS of the weights clipped to [1/C, C].
    """
    maskf = mask.to(log_ratio.dtype)
    has_tokens = mask.any(dim=-1)
    token = log_ratio.clamp(-clamp, clamp)
    rho = torch.exp(token)
    wide, widef = log_ratio.double(), maskf.double()
    exact = torch.stack([-wide, torch.expm1(wide) - wide, wide, wide.abs()])
    kl_k1, kl_k3, delta_mean, delta_abs_mean = ((exact * widef).sum(dim=(1, 2)) / widef.sum().clamp_min(1)).float()
    rho_sq = (rho.square() * maskf).sum() / maskf.sum().clamp_min(1)
    lengths = maskf.sum(dim=-1)
    seq_log = log_ratio.sum(dim=-1)  # log prod_t rho_t over the unclamped terms
    # PPL ratio exp(-(1/|T|) sum_t log rho_t), per sequence, averaged (the seed's definition).
    ppl_ratio = masked_mean(torch.exp(-seq_log.double() / lengths.clamp_min(1).double()), has_tokens).float()
    # chi^2_seq = E[(prod_t rho_t)^2] - 1 on the clamped totals (the seed), and its exact log.
    chi2_seq = masked_mean(torch.exp(2 * seq_log.clamp(-clamp, clamp)), has_tokens) - 1
    log_mean_rho = _seq_log_mean_exp(seq_log, has_tokens)
    log_mean_rho_sq = _seq_log_mean_exp(2 * seq_log, has_tokens)
    ess_seq = torch.exp(2 * log_mean_rho - log_mean_rho_sq)
    log_cap = torch.log(torch.tensor(cap, dtype=log_ratio.dtype, device=log_ratio.device))
    clipped_rho = torch.exp(token.clamp(-log_cap, log_cap))
    weight_mean = masked_mean(corr.weights, corr.mask)
    out = {
        "rc/kl_k1": kl_k1,
        "rc/kl_k3": kl_k3,
        "rc/ppl_ratio": ppl_ratio,
        "rc/chi2_token": rho_sq - 1,
        "rc/chi2_seq": chi2_seq,
        "rc/chi2_seq_log": torch.where(has_tokens.any(), log_mean_rho_sq, torch.zeros_like(log_mean_rho_sq)),
        "rc/ess_token": _ess(rho, maskf),
        "rc/ess_token_clipped": _ess(clipped_rho, maskf),
        "rc/ess_seq": torch.where(has_tokens.any(), ess_seq, torch.ones_like(ess_seq)),
        "rc/seq_log_ratio_mean": masked_mean(seq_log, has_tokens),
        "rc/seq_log_ratio_max": masked_max(seq_log, has_tokens),
        "rc/seq_log_ratio_min": masked_min(seq_log, has_tokens),
        "rc/rejection_token_frac": 1 - _fraction(corr.rejection_keep & mask, mask),
        "rc/delta_mean": delta_mean,
        "rc/delta_abs_mean": delta_abs_mean,
        "rc/delta_abs_max": masked_max(log_ratio.abs(), mask),
        "rc/masked_token_frac": 1 - _fraction(corr.mask, mask),
        "rc/masked_seq_frac": _fraction(corr.rejected_sequences, has_tokens),
        "rc/veto_seq_frac": _fraction(corr.vetoed_sequences & has_tokens, has_tokens),
        "rc/truncated_token_frac": _fraction(corr.truncated, mask),
        "rc/ratio_max": masked_max(rho, mask),
        "rc/ratio_min": masked_min(rho, mask),
        "rc/is_weight_mean": weight_mean,
        "rc/is_weight_std": masked_mean((corr.weights - weight_mean).square(), corr.mask).sqrt(),
        "rc/is_weight_max": masked_max(corr.weights, corr.mask),
        "rc/batch_norm_factor": corr.norm_factor,
    }
    for i, (mode, kept) in enumerate(corr.criteria):
        out[f"rc/rejection_token_frac/{i}_{mode}"] = 1 - _fraction(kept & mask, mask)
    out.update(_percentiles({"rc/ratio": (rho, mask), "rc/is_weight": (corr.weights, corr.mask)}))
    return out


def _contribution(ratio: Tensor, advantages: Tensor, mask: Tensor, prefix: str) -> dict[str, Tensor]:
    """Zero-centred contribution C(r) = -(r - 1) A (TIM paper eq. 5), mean over tokens with A > 0 / A < 0."""
    contribution = -(ratio - 1) * advantages
    return {
        f"{prefix}_pos": masked_mean(contribution, mask & (advantages > 0)),
        f"{prefix}_neg": masked_mean(contribution, mask & (advantages < 0)),
    }


def surrogate_diagnostics(ratio: Tensor, rollout_ratio: Tensor, advantages: Tensor, mask: Tensor,
                          clipped: Tensor, dual_clipped: Tensor) -> dict[str, Tensor]:
    """Clip fractions, PPO ratio stats and C(r) for r_train = pi_theta / pi_prox and r_rollout = pi_theta / pi_behav."""
    log_u = torch.log(ratio.clamp_min(1e-30))
    out = {
        "loss/clip_frac": _fraction(clipped, mask),
        "loss/dual_clip_frac": _fraction(dual_clipped, mask),
        "loss/ratio_mean": masked_mean(ratio, mask),
        "loss/ratio_max": masked_max(ratio, mask),
        "loss/ppo_kl_k3": masked_mean(ratio - 1 - log_u, mask),
    }
    out.update(_contribution(ratio, advantages, mask, "loss/contrib"))
    out.update(_contribution(rollout_ratio, advantages, mask, "rc/contrib_rollout"))
    return out


def batch_diagnostics(rewards: Tensor, shaped: Tensor, lengths: Tensor, correct: Tensor, advantages: Tensor,
                      mask: Tensor, keep: Tensor) -> dict[str, Tensor]:
    """Reward, response-length and advantage statistics of the whole batch."""
    if rewards.numel() == 0:
        return {}
    valid = mask & keep.unsqueeze(-1)
    return {
        "reward/mean": rewards.mean(),
        "reward/std": rewards.std(unbiased=False),
        "reward/min": rewards.min(),
        "reward/max": rewards.max(),
        "reward/shaped_mean": shaped.mean(),
        "reward/pass_rate": correct.float().mean(),
        "response/length_mean": lengths.mean(),
        "response/length_min": lengths.min(),
        "response/length_max": lengths.max(),
        "adv/mean": masked_mean(advantages, valid),
        "adv/std": masked_mean((advantages - masked_mean(advantages, valid)).square(), valid).sqrt(),
        "adv/abs_mean": masked_mean(advantages.abs(), valid),
        "adv/max": masked_max(advantages, valid),
        "adv/min": masked_min(advantages, valid),
        "adv/dash_dropped": (~keep).sum().float(),
        "adv/dash_dropped_frac": (~keep).float().mean(),
    }
