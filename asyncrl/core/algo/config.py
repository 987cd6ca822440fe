"""`AlgoConfig`: the typed selection of the learner's objective (docs/algorithms.md lists every mode).

Defaults: GRPO advantages, decoupled PPO (clip 0.2) with token-level IS weights truncated at C = 2, token-mean
aggregation, no KL, no OPD, no length penalty -- i.e. the `decoupled_token_is` preset with GRPO advantages.

`preset: <name>` expands to the explicit settings listed in `presets.PRESETS` before validation; fields the
user sets explicitly override the preset. An unknown mode, preset or an impossible threshold is a pydantic
`ValidationError` at load time.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, model_validator

from asyncrl.core.algo.presets import PRESETS
from asyncrl.core.algo.sections import (
    AdvantageConfig,
    AlgoSection,
    KLConfig,
    LengthPenaltyConfig,
    OPDConfig,
    PolicyLossConfig,
    RolloutCorrectionConfig,
)

PresetName = Literal[
    "decoupled_token_is", "decoupled_seq_is", "decoupled_seq_is_rs", "decoupled_geo_rs",
    "decoupled_geo_rs_token_tis", "decoupled_k3_rs", "decoupled_k3_rs_token_tis",
    "decoupled_geo_rs_seq_tis", "decoupled_k3_rs_seq_tis",
    "bypass_ppo_clip", "bypass_ppo_clip_geo_rs", "bypass_ppo_clip_k3_rs",
    "bypass_pg_is", "bypass_pg_geo_rs", "bypass_pg_geo_rs_token_tis", "bypass_pg_geo_rs_seq_tis",
    "tis_srs_k1_corr", "tis_srs_k3_corr", "disabled",
]


def _as_dict(value: Any) -> Any:
    """User input may hold section instances; only the fields they set explicitly count as overrides."""
    if isinstance(value, BaseModel):
        return value.model_dump(exclude_unset=True)
    return value


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        value = _as_dict(value)
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


class AlgoConfig(AlgoSection):
    preset: PresetName | None = None
    """Named rollout-correction preset (verl's table plus the TIM paper's tis_srs_*); expands to explicit
    bypass / policy_loss.type / rollout_correction settings. Explicitly set fields override it."""
    bypass: bool = False
    """Bypass mode: pi_prox := pi_behav, so the trainer skips the proximal forward (`needs_prox_forward` is
    False) and passes logp_prox = logp_behav. IS/RS ratios then use the detached current policy."""
    success_reward: float = 0.0
    """A rollout counts as correct/passed when its (unshaped) reward is above this (OPD, Kimi penalty)."""
    policy_loss: PolicyLossConfig = PolicyLossConfig()
    """Surrogate (PPO clip or REINFORCE), clip range, dual clip, loss aggregation."""
    rollout_correction: RolloutCorrectionConfig = RolloutCorrectionConfig()
    """IS weights, rejection masks and veto on the behaviour -> proximal gap."""
    advantage: AdvantageConfig = AdvantageConfig()
    """Advantage estimator, token-level variant, DASH gradient filtering."""
    kl: KLConfig = KLConfig()
    """KL to the frozen reference policy."""
    opd: OPDConfig = OPDConfig()
    """On-policy distillation with the teacher."""
    length_penalty: LengthPenaltyConfig = LengthPenaltyConfig()
    """Reward shaping by response length (length-dynamics study)."""

    @model_validator(mode="before")
    @classmethod
    def _expand_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        name = data.get("preset")
        if name is None or name not in PRESETS:
            return data  # unknown names fail the Literal check with the list of valid ones
        return _merge(PRESETS[name], data)

    @model_validator(mode="after")
    def _check_combination(self) -> AlgoConfig:
        loss, weights = self.policy_loss.type, self.rollout_correction.weights
        if loss == "reinforce" and not self.bypass:
            raise ValueError("policy_loss.type='reinforce' needs bypass=true: its IS weight is "
                             "pi_theta / pi_behav, computed on the fly (verl: loss_type=reinforce needs bypass)")
        if self.bypass and loss in ("ppo_clip", "gspo", "gspo_token") and weights != "none":
            raise ValueError(f"bypass with policy_loss.type={loss!r}: the ratio already is "
                             "pi_theta / pi_behav, IS weights would count the correction twice; "
                             "set rollout_correction.weights='none'")
        return self

    @property
    def needs_prox_forward(self) -> bool:
        """Whether the trainer must compute logp_prox with a no-grad forward (False in bypass mode, where the
        trainer passes logp_prox = logp_behav)."""
        return not self.bypass
