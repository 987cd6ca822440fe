"""`build_advantages`: rewards -> token-level advantages for one learner step (whole batch, before the
mini-batch split, because group statistics need every member of a group).

Order: correctness (unshaped reward > success_reward) -> length penalty on the scalar reward -> KL-in-reward
penalties as per-token rewards -> outcome advantages (estimator) [+ token-level reward-to-go] -> OPD advantage
replacement on eligible sequences (normalised on their own) -> DASH filter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from asyncrl.core.algo.config import AlgoConfig
from asyncrl.learner.algos.advantages import dash_keep, outcome_advantages, process_advantages
from asyncrl.learner.algos.diagnostics import batch_diagnostics, to_floats
from asyncrl.learner.algos.groups import Groups
from asyncrl.learner.algos.kl import kl_to_reference
from asyncrl.learner.algos.length_dynamics import length_dynamics
from asyncrl.learner.algos.masked import (
    as_bool_mask,
    check_sequence_tensor,
    check_token_tensor,
    masked_fill_zero,
    masked_mean,
    masked_sum,
)
from asyncrl.learner.algos.opd import (
    check_teacher_alignment,
    eligible_sequences,
    horizon_mask,
    opd_advantages,
)
from asyncrl.learner.algos.pass_at_k_reward import pass_at_k_rewards
from asyncrl.learner.algos.shaping import shape_rewards


@dataclass
class AdvantageResult:
    advantages: Tensor
    """[N, T] float32 token-level advantages, 0 on padding and on DASH-dropped rows."""
    keep: Tensor
    """[N] bool: rows to train on. False = dropped by DASH gradient filtering (skip their forward/backward)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Flat metrics: reward/*, response/*, adv/*, opd/*, kl/* (docs/algorithms.md)."""
    opd_mask: Tensor | None = None
    """[N, T] bool when OPD is enabled: eligible sequences' tokens within the horizon. Pass the rows you train
    on to `policy_objective(..., opd_mask=...)` in OPD loss mode."""
    shaped_rewards: Tensor | None = None
    """[N] rewards after the length penalty (before KL-in-reward)."""


def _kl_reward(cfg: AlgoConfig, mask: Tensor, logp_prox: Tensor | None, logp_ref: Tensor | None
               ) -> tuple[Tensor, dict[str, Tensor]]:
    if logp_prox is None or logp_ref is None:
        raise ValueError("kl.mode='reward' needs logp_prox and logp_ref in build_advantages")
    k = kl_to_reference(logp_prox.detach().float(), logp_ref.float(), mask, cfg.kl.estimator,
                        cfg.rollout_correction.log_ratio_clamp)
    return -cfg.kl.coef * k, {"kl/ref_kl": masked_mean(k, mask),
                              "kl/reward_penalty": cfg.kl.coef * masked_sum(k, mask) / max(1, mask.shape[0])}


def _apply_opd(cfg: AlgoConfig, advantages: Tensor, mask: Tensor, correct: Tensor, groups: Groups,
               logp_prox: Tensor | None, logp_teacher: Tensor | None) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    check_teacher_alignment(logp_teacher, mask)
    pass_rate = groups.mean_per_sequence(correct.float())
    eligible = eligible_sequences(correct, pass_rate, cfg.opd.pass_rate_threshold)
    opd_mask = horizon_mask(mask, cfg.opd.horizon) & eligible.unsqueeze(-1)
    hard = pass_rate < cfg.opd.pass_rate_threshold
    metrics = {
        "opd/eligible_frac": eligible.float().mean(),
        "opd/hard_seq_frac": hard.float().mean(),
        "opd/token_frac": opd_mask.sum().float() / mask.sum().clamp_min(1).float(),
    }
    if logp_prox is not None:
        check_token_tensor("logp_prox", logp_prox, mask)
        metrics["opd/kl_k1"] = masked_mean(logp_prox.detach().float() - logp_teacher.float(), opd_mask)
    if cfg.opd.mode == "advantage":
        if logp_prox is None:
            raise ValueError("opd.mode='advantage' needs logp_prox (the student's log-probs) in build_advantages")
        teacher_adv = opd_advantages(logp_prox.float(), logp_teacher.float(), opd_mask, cfg.opd.normalize,
                                     cfg.advantage.eps, cfg.rollout_correction.log_ratio_clamp)
        advantages = torch.where(eligible.unsqueeze(-1), teacher_adv, advantages)
        metrics["opd/adv_abs_mean"] = masked_mean(teacher_adv.abs(), opd_mask)
    return advantages, opd_mask, metrics


def build_advantages(rewards: Tensor, group_index: Tensor, response_mask: Tensor, cfg: AlgoConfig,
                     logp_prox: Tensor | None = None, logp_teacher: Tensor | None = None, *,
                     logp_ref: Tensor | None = None, token_rewards: Tensor | None = None,
                     anchor_lengths: Tensor | None = None, finished: Tensor | None = None,
                     process_rewards: Tensor | None = None, process_mask: Tensor | None = None) -> AdvantageResult:
    """Token-level advantages [N, T], the DASH keep mask [N] and batch metrics.

    rewards [N] (one scalar per sequence), group_index [N] (same value = same prompt), response_mask [N, T].
    Optional: logp_prox [N, T] (OPD advantage mode, KL-in-reward), logp_teacher [N, T] (OPD), logp_ref [N, T]
    (KL-in-reward), token_rewards [N, T] (extra per-token rewards), anchor_lengths [N] (anchor penalty),
    finished [N] bool (ended with EOS: the truncation figure of the length dynamics), process_rewards [N, T] with
    process_mask [N, T] (training-free process rewards at episode ends: always token-level, normalised over
    their positions alone, separately from the outcome and from any other per-token reward).
    """
    mask = as_bool_mask(response_mask)
    n = mask.shape[0]
    check_sequence_tensor("rewards", rewards, n)
    check_sequence_tensor("group_index", group_index, n)
    for name, tensor in (("logp_prox", logp_prox), ("logp_ref", logp_ref), ("token_rewards", token_rewards)):
        check_token_tensor(name, tensor, mask)
    if anchor_lengths is not None:
        check_sequence_tensor("anchor_lengths", anchor_lengths, n)
    rewards = rewards.detach().float()
    lengths = mask.sum(dim=-1).float()
    correct = rewards > cfg.success_reward
    groups = Groups.of(group_index)
    outcome = rewards if cfg.advantage.pass_at_k is None else pass_at_k_rewards(rewards, groups, cfg.advantage.pass_at_k)
    shaped = shape_rewards(outcome, lengths, correct, groups, cfg.length_penalty, anchor_lengths)
    metrics: dict[str, Tensor] = {}

    process = None if token_rewards is None else masked_fill_zero(token_rewards.detach().float(), mask)
    if cfg.kl.mode == "reward":
        penalty, kl_metrics = _kl_reward(cfg, mask, logp_prox, logp_ref)
        metrics.update(kl_metrics)
        process = penalty if process is None else process + penalty
    scalar = shaped
    if process is not None and not cfg.advantage.token_level:
        scalar = shaped + masked_sum(process, mask, dim=-1)  # verl's GRPO: per-token rewards summed first
    estimator, eps = cfg.advantage.estimator, cfg.advantage.eps
    advantages = outcome_advantages(scalar, groups, estimator, eps).unsqueeze(-1).expand(mask.shape)
    if process is not None and cfg.advantage.token_level:
        advantages = advantages + process_advantages(process, mask, groups, estimator, eps)
    if process_rewards is not None and process_mask is not None:
        check_token_tensor("process_rewards", process_rewards, mask)
        episodes = process_mask.bool() & mask
        advantages = advantages + process_advantages(process_rewards.detach().float(), mask, groups, estimator, eps,
                                                     where=episodes)
        metrics.update(process_metrics(process_rewards.float(), episodes))
    advantages = masked_fill_zero(advantages, mask)

    opd_mask = None
    if cfg.opd.enabled:
        advantages, opd_mask, opd_metrics = _apply_opd(cfg, advantages, mask, correct, groups, logp_prox,
                                                       logp_teacher)
        metrics.update(opd_metrics)

    keep = dash_keep(advantages, mask, cfg.advantage.dash_threshold)
    advantages = masked_fill_zero(advantages, keep.unsqueeze(-1).expand(mask.shape))
    metrics.update(batch_diagnostics(rewards, shaped, lengths, correct, advantages, mask, keep))
    metrics.update(length_dynamics(lengths, correct, groups, cfg.policy_loss.aggregation, finished=finished,
                                   trained=keep))
    return AdvantageResult(advantages=advantages, keep=keep, metrics=to_floats(metrics), opd_mask=opd_mask,
                           shaped_rewards=shaped)


def process_metrics(process_rewards: Tensor, episodes: Tensor) -> dict[str, Tensor]:
    """The process rewards a batch carried: episode ends per sequence, the mean and mean |U| over them, the
    share of sequences with any."""
    count = episodes.sum()
    values = process_rewards[episodes]
    return {
        "process/episodes_per_seq": count.float() / max(1, episodes.shape[0]),
        "process/utility_mean": values.mean() if values.numel() else torch.zeros(()),
        "process/utility_abs_mean": values.abs().mean() if values.numel() else torch.zeros(()),
        "process/seq_frac": episodes.any(dim=-1).float().mean(),
    }
