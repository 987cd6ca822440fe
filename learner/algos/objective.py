"""`policy_objective`: the scalar loss of one mini-batch plus every per-step diagnostic.

Per token (on the response mask after rejection / veto):
    L_t = -w_t s_t                                   (policy term; s_t from policy_loss, w_t detached IS weight)
        + beta_kl * k_t  or  beta_kl * w_t max(u_t k_t, clip(u_t) k_t)     (kl.mode == "loss")
        + beta_opd * 0.5 (logp_t - logp_teacher_t)^2 on OPD tokens         (opd.mode == "loss")
then one aggregation (token-mean / seq-mean-token-sum / seq-mean-token-mean) of the sum, so every term shares
the same normaliser. The correction ratio rho_t = pi_prox / pi_behav (decoupled) or pi_theta / pi_behav
(bypass, detached) drives the IS weights, the rejection masks and the rc/* diagnostics.
"""

from __future__ import annotations

import torch
from torch import Tensor

from asyncrl.core.algo.config import AlgoConfig
from asyncrl.learner.algos.aggregation import aggregate_loss, aggregation_units
from asyncrl.learner.algos.diagnostics import (
    perplexity_diagnostics,
    rollout_diagnostics,
    surrogate_diagnostics,
    to_floats,
)
from asyncrl.learner.algos.kl import importance_corrected_kl, kl_to_reference
from asyncrl.learner.algos.masked import (
    as_bool_mask,
    check_token_tensor,
    clamped_log_ratio,
    log_ratio,
    masked_mean,
)
from asyncrl.learner.algos.opd import check_teacher_alignment, opd_k2_loss
from asyncrl.learner.algos.policy_loss import (
    gspo_surrogate,
    gspo_token_surrogate,
    ppo_clip_surrogate,
    reinforce_surrogate,
)
from asyncrl.learner.algos.rollout_correction import apply_rollout_correction


def _check_inputs(mask: Tensor, **tensors: Tensor | None) -> None:
    for name, tensor in tensors.items():
        check_token_tensor(name, tensor, mask)


def policy_objective(logp: Tensor, logp_prox: Tensor, logp_behav: Tensor, advantages: Tensor,
                     response_mask: Tensor, cfg: AlgoConfig, logp_ref: Tensor | None = None,
                     logp_teacher: Tensor | None = None, *, opd_mask: Tensor | None = None,
                     units: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """(scalar loss, metrics) for one mini-batch; all per-token inputs are [N, T].

    logp carries the gradient; logp_prox / logp_behav / advantages are treated as constants. In bypass mode
    pass logp_prox = logp_behav. opd_mask ([N, T] bool, `AdvantageResult.opd_mask` rows) is required in OPD
    loss mode. The loss is finite and exactly 0 when every token is masked or rejected.
    """
    mask = as_bool_mask(response_mask)
    _check_inputs(mask, logp=logp, logp_prox=logp_prox, logp_behav=logp_behav, advantages=advantages,
                  logp_ref=logp_ref, opd_mask=opd_mask)
    rc, pl = cfg.rollout_correction, cfg.policy_loss
    clamp = rc.log_ratio_clamp
    logp = logp.float()
    logp_prox = logp_prox.detach().float()
    logp_behav = logp_behav.detach().float()
    advantages = advantages.detach().float()

    correction_numerator = logp.detach() if cfg.bypass else logp_prox
    correction_log_ratio = log_ratio(correction_numerator, logp_behav, mask)  # unclamped: rc clamps as the seed does
    corr = apply_rollout_correction(correction_log_ratio, mask, rc)
    final = corr.mask

    if pl.type == "ppo_clip":
        surrogate = ppo_clip_surrogate(logp, logp_prox, advantages, final, pl.clip_eps_low, pl.clip_eps_high,
                                       pl.dual_clip_c, clamp)
        objective, ratio = surrogate.objective, surrogate.ratio
        clipped, dual_clipped = surrogate.clipped, surrogate.dual_clipped
    elif pl.type in ("gspo", "gspo_token"):
        gspo = gspo_surrogate if pl.type == "gspo" else gspo_token_surrogate
        surrogate = gspo(logp, logp_prox, advantages, final, pl.clip_eps_low, pl.clip_eps_high, clamp)
        objective, ratio = surrogate.objective, surrogate.ratio
        clipped, dual_clipped = surrogate.clipped, surrogate.dual_clipped
    else:
        objective = reinforce_surrogate(logp, advantages, final)
        ratio = torch.exp(clamped_log_ratio(logp, logp_prox, final, clamp))
        clipped = dual_clipped = torch.zeros_like(final)
    parts = {"loss/pg": -corr.weights * objective}

    if cfg.kl.mode == "loss":
        if logp_ref is None:
            raise ValueError("kl.mode='loss' needs logp_ref in policy_objective")
        k = kl_to_reference(logp, logp_ref.detach().float(), final, cfg.kl.estimator, clamp)
        if cfg.kl.loss_is_correction:
            # REINFORCE runs in bypass mode, where u already is the full pi_theta / pi_behav ratio.
            weight = corr.weights if pl.type != "reinforce" else 1.0
            k = weight * importance_corrected_kl(k, ratio, pl.clip_eps_low, pl.clip_eps_high)
        parts["loss/kl"] = cfg.kl.coef * k

    if cfg.opd.enabled and cfg.opd.mode == "loss":
        check_teacher_alignment(logp_teacher, mask)
        if opd_mask is None:
            raise ValueError("opd.mode='loss' needs opd_mask (AdvantageResult.opd_mask rows) in policy_objective")
        opd_tokens = final & as_bool_mask(opd_mask)
        opd_k2 = opd_k2_loss(logp, logp_teacher.float(), opd_tokens, clamp)
        parts["loss/opd"] = cfg.opd.coef * opd_k2

    token_loss = parts["loss/pg"]
    for name, part in parts.items():
        if name != "loss/pg":
            token_loss = token_loss + part
    loss = aggregate_loss(token_loss, final, pl.aggregation, units)

    with torch.no_grad():
        metrics = {name: aggregate_loss(part, final, pl.aggregation) for name, part in parts.items()}
        metrics.update(rollout_diagnostics(correction_log_ratio, mask, corr, rc.weight_cap, clamp))
        metrics.update(perplexity_diagnostics(correction_numerator, logp_behav, mask))
        rollout_ratio = torch.exp(clamped_log_ratio(logp.detach(), logp_behav, mask, clamp))
        metrics.update(surrogate_diagnostics(ratio.detach(), rollout_ratio, advantages, final, clipped,
                                             dual_clipped))
        if logp_ref is not None:
            ref_log_r = clamped_log_ratio(logp_ref.float(), logp.detach(), mask, clamp)
            metrics["kl/ref_k1"] = masked_mean(-ref_log_r, mask)
            metrics["kl/ref_k3"] = masked_mean(torch.expm1(ref_log_r) - ref_log_r, mask)
        if "loss/opd" in parts:
            metrics["opd/k2_mean"] = masked_mean(opd_k2, opd_tokens)
    return loss, to_floats(metrics)


def objective_units(logp_prox: Tensor, logp_behav: Tensor, response_mask: Tensor, cfg: AlgoConfig) -> Tensor:
    """The loss denominator of a mini-batch (`aggregation_units` of its mask after rejection), known before
    its forward: decoupled objectives reject on pi_prox / pi_behav. A mini-batch trained in parts
    (micro-batches, ranks) passes it to `policy_objective(..., units=)` of every part."""
    if cfg.bypass:
        raise ValueError("bypass objectives reject on the current policy: their loss denominator is only known "
                         "after the forward, so they cannot be trained in parts")
    mask = as_bool_mask(response_mask)
    correction_log_ratio = log_ratio(logp_prox.detach().float(), logp_behav.detach().float(), mask)
    return aggregation_units(apply_rollout_correction(correction_log_ratio, mask, cfg.rollout_correction).mask,
                             cfg.policy_loss.aggregation)
