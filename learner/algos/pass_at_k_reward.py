"""The pass@k reward (seed: "What's in Pass@K?", after Chen et al.): each group's samples, in order, are split
into subgroups of k and every sample gets its subgroup's best reward, a Monte Carlo pass@k objective that
weighs hard prompts up (on an easy prompt nearly every subgroup has a success, so the advantages vanish).
The post's caveats: it spends the same compute on every prompt and discounts the easy ones only afterwards
(`sampling.drop_uniform_groups` and sampling hard prompts more spend it where it teaches), and training has to
come back to pass@1 (k = 1, or off) for single-shot performance."""

from __future__ import annotations

from torch import Tensor

from asyncrl.learner.algos.groups import Groups


def pass_at_k_rewards(rewards: Tensor, groups: Groups, k: int) -> Tensor:
    """[N]: each sample's reward replaced by the best of its subgroup (its group's samples in batch order, k at
    a time). Every group's size must be a multiple of k."""
    if k < 1:
        raise ValueError(f"pass@k reward needs k >= 1, got {k}")
    out = rewards.clone()
    for group in range(groups.count):
        members = (groups.inverse == group).nonzero().flatten()
        if members.numel() % k:
            raise ValueError(f"pass@k reward: a group of {members.numel()} samples does not split into "
                             f"subgroups of k = {k}")
        for start in range(0, members.numel(), k):
            subgroup = members[start:start + k]
            out[subgroup] = rewards[subgroup].max()
    return out

