"""The sections of `AlgoConfig`, one per concern. Each validates its own thresholds at load time; rules that
span sections (bypass vs. loss type vs. IS weights) live in `config.AlgoConfig`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

LossType = Literal["ppo_clip", "reinforce", "gspo", "gspo_token"]
LossAggregation = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
ISLevel = Literal["none", "token", "sequence", "geometric"]
RejectionMode = Literal[
    "none",
    "token_k1", "seq_sum_k1", "seq_mean_k1",
    "token_k2", "seq_sum_k2", "seq_mean_k2", "seq_max_k2",
    "token_k3", "seq_mean_k3", "seq_sum_k3", "seq_max_k3",
]
RATIO_BOUND_MODES = ("token_k1", "seq_sum_k1", "seq_mean_k1")
"""Modes whose thresholds are bounds on a probability ratio (lower and/or upper, bracketing 1)."""
DIVERGENCE_MODES = (
    "token_k2", "seq_sum_k2", "seq_mean_k2", "seq_max_k2", "token_k3", "seq_mean_k3", "seq_sum_k3", "seq_max_k3",
)
"""Modes whose threshold is an upper bound on a non-negative divergence statistic."""
AdvantageEstimator = Literal["grpo", "drgrpo", "rloo", "reinforce"]
KLEstimator = Literal["k1", "k2", "k3"]
KLMode = Literal["none", "reward", "loss"]
OPDMode = Literal["advantage", "loss"]
LengthPenalty = Literal["none", "uniform", "group", "anchor"]


class AlgoSection(BaseModel):
    """Base of every objective section: unknown keys are errors, field docstrings are descriptions."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


class PolicyLossConfig(AlgoSection):
    type: LossType = "ppo_clip"
    """"ppo_clip": (decoupled) PPO clipped surrogate; "reinforce": -sg(w) * A * log pi (needs bypass);
    "gspo": the clipped surrogate on the sequence-level geometric-mean ratio s = exp(mean_t (logp - logp_prox))
    and the sequence's mean advantage (GSPO; its paper clips s at about 3e-4 / 4e-4: set clip_eps_low /
    clip_eps_high accordingly); "gspo_token": GSPO-token, the same sequence ratio clipped against each token's
    own advantage (its value is s, its gradient flows through each token's log-prob): what token-level
    advantages (OPD in advantage mode, process rewards) need, where "gspo" averages them away."""
    clip_eps_low: float = Field(0.2, gt=0, lt=1)
    """epsilon_low: the PPO ratio is clipped below at 1 - epsilon_low."""
    clip_eps_high: float = Field(0.2, gt=0)
    """epsilon_high: the PPO ratio is clipped above at 1 + epsilon_high (> epsilon_low = DAPO clip-higher)."""
    dual_clip_c: float | None = Field(None, gt=1)
    """Dual-clip constant c > 1: for A < 0 the per-token objective is bounded below by c * A (null = off)."""
    aggregation: LossAggregation = "token-mean"
    """How the per-token loss matrix becomes a scalar: token-mean (DAPO), seq-mean-token-sum (Dr.GRPO),
    seq-mean-token-mean (original GRPO)."""


def check_rejection_bounds(mode: str, low: float | None, high: float | None, where: str) -> None:
    """The thresholds a rejection mode needs; `where` prefixes the messages (a chained criterion's index)."""
    if mode in RATIO_BOUND_MODES:
        if low is None and high is None:
            raise ValueError(f"{where}rejection={mode!r} needs rejection_lower and/or rejection_upper (ratio bounds)")
        if low is not None and low > 1:
            raise ValueError(f"{where}rejection_lower={low} must be <= 1: a lower bound above 1 rejects on-policy data")
        if high is not None and high < 1:
            raise ValueError(f"{where}rejection_upper={high} must be >= 1: an upper bound below 1 rejects "
                             "on-policy data")
    elif mode in DIVERGENCE_MODES:
        if high is None:
            raise ValueError(f"{where}rejection={mode!r} needs rejection_upper (an upper bound on the statistic)")
        if low is not None:
            raise ValueError(f"{where}rejection={mode!r} bounds a non-negative divergence from above only; "
                             "unset rejection_lower")
    elif low is not None or high is not None:
        raise ValueError(f"{where}rejection_lower/rejection_upper are set but rejection='none'")


class RejectionCriterion(AlgoSection):
    """One more rejection criterion chained after `rejection` (same modes and bounds)."""

    rejection: RejectionMode
    """The mode (as `rollout_correction.rejection`)."""
    rejection_lower: float | None = Field(None, gt=0)
    """Lower ratio bound (*_k1 modes)."""
    rejection_upper: float | None = Field(None, gt=0)
    """Upper bound of the ratio (*_k1) or of the statistic (k2/k3)."""

    @model_validator(mode="after")
    def _check(self) -> RejectionCriterion:
        if self.rejection == "none":
            raise ValueError("more_rejections: 'none' is not a criterion; remove the entry")
        check_rejection_bounds(self.rejection, self.rejection_lower, self.rejection_upper, "more_rejections: ")
        return self


class RolloutCorrectionConfig(AlgoSection):
    weights: ISLevel = "token"
    """Truncated IS weights on the behaviour->proximal gap: "token" w_t = min(rho_t, C), "sequence"
    w = min(prod_t rho_t, C) broadcast to the sequence, "geometric" w = min(exp(mean_t log rho_t), C) (the
    per-token geometric mean ratio: length-invariant), or "none". rho_t = pi_prox / pi_behav (decoupled) or
    pi_theta / pi_behav, detached (bypass)."""
    weight_cap: float = Field(2.0, ge=1)
    """C: the truncation cap of the IS weights (>= 1, so on-policy tokens keep weight 1)."""
    batch_normalize: bool = False
    """Rescale the (truncated) IS weights to mean 1 over the valid tokens (token) or sequences (sequence)."""
    rejection: RejectionMode = "none"
    """Rejection mask: token_k1 / seq_sum_k1 / seq_mean_k1 (Geo-RS) bound a ratio; token_k2, seq_sum_k2,
    seq_mean_k2, seq_max_k2 bound 0.5 (log rho)^2; seq_mean_k3 / seq_sum_k3 bound rho - 1 - log rho."""
    rejection_lower: float | None = Field(None, gt=0)
    """Lower ratio bound of the *_k1 modes (<= 1); null = no lower bound. Not allowed for k2/k3 modes."""
    rejection_upper: float | None = Field(None, gt=0)
    """Upper bound: of the ratio for *_k1 modes (>= 1; null = none), of the statistic for k2/k3 modes."""
    veto_threshold: float | None = Field(None, gt=0, lt=1)
    """Per-token veto: reject the whole sequence if any token has rho_t below this (null = off)."""
    log_ratio_clamp: float = Field(20.0, gt=0)
    """Every log-ratio (and sequence log-ratio sum) is clamped to +-this before exp, for numerical safety."""

    more_rejections: list[RejectionCriterion] = Field(default_factory=list)
    """Further rejection criteria, chained: a token survives only if `rejection` and every one of these keep
    it (e.g. Geo-RS plus a seq_max_k3 spike filter). Each reports its own rejected-token fraction."""

    @model_validator(mode="after")
    def _check_thresholds(self) -> RolloutCorrectionConfig:
        check_rejection_bounds(self.rejection, self.rejection_lower, self.rejection_upper, "")
        return self


class AdvantageConfig(AlgoSection):
    estimator: AdvantageEstimator = "grpo"
    """"grpo" (R - group mean) / (group std + eps); "drgrpo" R - group mean; "rloo" leave-one-out baseline;
    "reinforce" batch whitening (R - batch mean) / (batch std + eps), groups ignored."""
    eps: float = Field(1e-6, gt=0)
    """Added to standard deviations before dividing."""
    token_level: bool = False
    """Keep per-token rewards (KL-in-reward penalties, caller-given token rewards) per token: they are
    normalised separately from the outcome reward and enter as reward-to-go. False: summed into the scalar."""
    dash_threshold: float | None = Field(None, ge=0)
    """DASH gradient filtering: drop sequences whose max_t |A_t| is below this before the backward pass
    (their advantages become 0 and `keep` is False). null = off; the DASH paper uses 0.1."""
    pass_at_k: int | None = Field(None, ge=1)
    """The pass@k reward: each group's samples are split, in order, into subgroups of k, and each sample's
    reward becomes its subgroup's best before the advantages (learner/algos/pass_at_k_reward.py has the
    caveats). The group size must be a multiple of k, with two subgroups at least. null = off (pass@1)."""


class KLConfig(AlgoSection):
    mode: KLMode = "none"
    """KL to the frozen reference (logp_ref): "reward" subtracts coef * k_t from the per-token reward,
    "loss" adds coef * k_t to the per-token loss, "none" only reports it when logp_ref is given."""
    estimator: KLEstimator = "k3"
    """k1 = log pi - log pi_ref; k2 = 0.5 (log pi - log pi_ref)^2; k3 = r - 1 - log r with r = pi_ref / pi."""
    coef: float = Field(1e-3, ge=0)
    """beta of the KL term."""
    loss_is_correction: bool = True
    """KL as loss: multiply k_t by the PPO ratio with the same clip (max(u k, clip(u) k), the loss-side form
    of the blog's min), so multi-epoch/off-policy updates estimate KL under pi_theta."""


class OPDConfig(AlgoSection):
    enabled: bool = False
    """On-policy distillation with the teacher's per-token log-probs (needs logp_teacher)."""
    mode: OPDMode = "advantage"
    """"advantage": eligible sequences get A_t = -(logp_prox - logp_teacher) (K1) instead of the RL
    advantage; "loss": add coef * 0.5 (logp - logp_teacher)^2 (K2) on eligible tokens."""
    pass_rate_threshold: float = Field(0.5, ge=0, le=1)
    """A prompt is hard when its group's pass rate is below this; failed rollouts of hard prompts are eligible."""
    horizon: int | None = Field(None, ge=1)
    """Only the first K response tokens of an eligible sequence receive the teacher signal (null = all)."""
    normalize: bool = True
    """Advantage mode: normalise OPD advantages over the OPD tokens only (mean/std), separately from RL ones."""
    coef: float = Field(0.1, ge=0)
    """beta of the K2 loss (loss mode)."""


class LengthPenaltyConfig(AlgoSection):
    type: LengthPenalty = "none"
    """"uniform" R - alpha L; "group" Kimi k1.5 min/max-normalised per prompt group; "anchor"
    R - gamma max(0, (L - anchor) / anchor)."""
    alpha: float = Field(1e-4, ge=0)
    """Uniform penalty per response token."""
    beta: float = Field(0.1, ge=0)
    """Group (Kimi) penalty coefficient; lambda = 0.5 - (L - min_len) / (max_len - min_len)."""
    gamma: float = Field(0.01, ge=0)
    """Anchor penalty coefficient."""
    anchor_length: int | None = Field(None, ge=1)
    """Anchor length in tokens for "anchor" (a per-sequence `anchor_lengths` argument overrides it)."""

    @model_validator(mode="after")
    def _check_anchor(self) -> LengthPenaltyConfig:
        if self.type == "anchor" and self.anchor_length is None:
            raise ValueError("length_penalty.type='anchor' needs anchor_length (tokens, >= 1)")
        return self
