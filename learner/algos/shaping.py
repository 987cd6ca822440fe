"""Length penalties on the scalar reward (seed: off-policy blog, "Mitigating Overthinking: Length Penalty
Interventions"). R is the task reward, L the response length in tokens.

- uniform:  R - alpha L
- group (Kimi k1.5): lambda = 0.5 - (L - min_len) / (max_len - min_len) over the prompt's group;
  correct: R + beta lambda; incorrect: R + beta min(0, lambda). A group whose lengths are all equal has no
  spread to normalise by and gets lambda = 0.
- anchor:   R - gamma max(0, (L - anchor) / anchor), anchor = the length when the prompt was first solved
  reliably (or a fixed reference length).
"""

from __future__ import annotations

import torch
from torch import Tensor

from asyncrl.core.algo.sections import LengthPenaltyConfig
from asyncrl.learner.algos.groups import Groups


def uniform_length_penalty(rewards: Tensor, lengths: Tensor, alpha: float) -> Tensor:
    return rewards - alpha * lengths


def group_length_penalty(rewards: Tensor, lengths: Tensor, correct: Tensor, groups: Groups,
                         beta: float) -> Tensor:
    inverse = groups.inverse
    inf = torch.full((groups.count,), float("inf"), dtype=lengths.dtype, device=lengths.device)
    min_len = inf.scatter_reduce(0, inverse, lengths, reduce="amin")[inverse]
    max_len = (-inf).scatter_reduce(0, inverse, lengths, reduce="amax")[inverse]
    spread = max_len - min_len
    lam = torch.where(spread > 0, 0.5 - (lengths - min_len) / spread.clamp_min(1e-12), torch.zeros_like(lengths))
    return torch.where(correct, rewards + beta * lam, rewards + beta * lam.clamp(max=0.0))


def anchor_length_penalty(rewards: Tensor, lengths: Tensor, anchor: Tensor, gamma: float) -> Tensor:
    anchor = anchor.to(lengths.dtype)
    return rewards - gamma * ((lengths - anchor) / anchor).clamp(min=0.0)


def shape_rewards(rewards: Tensor, lengths: Tensor, correct: Tensor, groups: Groups,
                  cfg: LengthPenaltyConfig, anchor_lengths: Tensor | None = None) -> Tensor:
    """Apply the configured length penalty to the scalar rewards [N]."""
    if cfg.type == "none" or rewards.numel() == 0:
        return rewards
    if cfg.type == "uniform":
        return uniform_length_penalty(rewards, lengths, cfg.alpha)
    if cfg.type == "group":
        return group_length_penalty(rewards, lengths, correct, groups, cfg.beta)
    if cfg.type == "anchor":
        if anchor_lengths is None:
            anchor_lengths = torch.full_like(lengths, float(cfg.anchor_length))
        return anchor_length_penalty(rewards, lengths, anchor_lengths, cfg.gamma)
    raise ValueError(f"unknown length penalty {cfg.type!r}")


def anchor_candidates(lengths: Tensor, correct: Tensor, group_index: Tensor,
                      competence: float = 0.9) -> dict[int, float]:
    """Per group index: mean length of the correct responses, for groups whose pass rate exceeds `competence`
    (the blog sets the anchor when pass@1 first exceeds 90 %). The caller keeps the first value per prompt."""
    out: dict[int, float] = {}
    for g in torch.unique(group_index).tolist():
        rows = group_index == g
        if correct[rows].float().mean().item() > competence:
            out[int(g)] = lengths[rows & correct].float().mean().item()
    return out
