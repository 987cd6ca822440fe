"""The learner's objective family as pure functions on tensors (see docs/algorithms.md).

The trainer calls three things:
- `build_advantages(rewards, group_index, response_mask, cfg, logp_prox, logp_teacher, *, logp_ref,
  token_rewards, anchor_lengths) -> AdvantageResult` once per learner step on the whole batch;
- `policy_objective(logp, logp_prox, logp_behav, advantages, response_mask, cfg, logp_ref, logp_teacher, *,
  opd_mask) -> (loss, metrics)` per mini-batch;
- `AlgoConfig.needs_prox_forward` to decide whether to run the no-grad proximal forward.
`pass_at_k` is the unbiased evaluation estimator.
"""

from asyncrl.core.algo import PRESET_NAMES, PRESETS, AlgoConfig
from asyncrl.learner.algos.advantage_builder import AdvantageResult, build_advantages
from asyncrl.learner.algos.evaluation import pass_at_k
from asyncrl.learner.algos.objective import objective_units, policy_objective

__all__ = [
    "PRESETS",
    "PRESET_NAMES",
    "AdvantageResult",
    "AlgoConfig",
    "build_advantages",
    "objective_units",
    "pass_at_k",
    "policy_objective",
]
