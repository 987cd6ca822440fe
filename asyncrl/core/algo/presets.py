"""Named rollout-correction presets (verl's table, seed `verl-rollout-correction-math.txt`, plus the two
TIM-paper objectives of its appendix A.4, seed `training-inference-mismatch-paper.txt`).

A preset is plain data: the explicit settings it stands for. `AlgoConfig` expands `preset: <name>` into these
settings before validation, and any field the user also sets explicitly wins over the preset. Every preset
states *all* of the correction fields (mode, loss type, IS weights, rejection, veto, batch normalisation), so a
preset means the same thing whatever the field defaults are.

Thresholds follow the seeds: IS cap C = 2; Geo-RS bounds [0.999, 1.001] (about +-0.1 % average per-token
drift); seq-sum ratio bounds [0.5, 2.0]; K3 mean threshold 0.01; the TIM paper's tau_tok = 2, tau_seq = 0.001.
"""

from __future__ import annotations

import math
from typing import Any

# Shared pieces, so the table below reads like the seed's table.
_NO_CORRECTION = {
    "weights": "none",
    "weight_cap": 2.0,
    "rejection": "none",
    "rejection_lower": None,
    "rejection_upper": None,
    "veto_threshold": None,
    "batch_normalize": False,
    "more_rejections": [],
}
_TOKEN_IS = {"weights": "token", "weight_cap": 2.0}
_SEQ_IS = {"weights": "sequence", "weight_cap": 2.0}
_GEO_RS = {"rejection": "seq_mean_k1", "rejection_lower": 0.999, "rejection_upper": 1.001}
_SEQ_SUM_RS = {"rejection": "seq_sum_k1", "rejection_lower": 0.5, "rejection_upper": 2.0}
_K3_RS = {"rejection": "seq_mean_k3", "rejection_upper": 0.01}

# TIM paper (A.4): sum_t K1(r_corr) <= tau_seq with K1(r) = -log r  <=>  prod_t r_t >= exp(-tau_seq),
# i.e. seq_sum_k1 with a lower ratio bound only; sum_t K3(r_corr) <= tau_seq is the seq_sum_k3 mode.
TIM_TAU_TOK = 2.0
TIM_TAU_SEQ = 0.001
_TIM_TOKEN_TIS = {"weights": "token", "weight_cap": TIM_TAU_TOK}
_TIM_SRS_K1 = {"rejection": "seq_sum_k1", "rejection_lower": math.exp(-TIM_TAU_SEQ), "rejection_upper": None}
_TIM_SRS_K3 = {"rejection": "seq_sum_k3", "rejection_upper": TIM_TAU_SEQ}


def _preset(bypass: bool, loss: str, *parts: dict[str, Any]) -> dict[str, Any]:
    correction = dict(_NO_CORRECTION)
    for part in parts:
        correction.update(part)
    return {"bypass": bypass, "policy_loss": {"type": loss}, "rollout_correction": correction}


PRESETS: dict[str, dict[str, Any]] = {
    # Decoupled PPO (three policies: behav, prox, theta); IS/RS ratios are pi_prox / pi_behav.
    "decoupled_token_is": _preset(False, "ppo_clip", _TOKEN_IS),
    "decoupled_seq_is": _preset(False, "ppo_clip", _SEQ_IS),
    "decoupled_seq_is_rs": _preset(False, "ppo_clip", _SEQ_IS, _SEQ_SUM_RS),
    "decoupled_geo_rs": _preset(False, "ppo_clip", _GEO_RS),
    "decoupled_geo_rs_token_tis": _preset(False, "ppo_clip", _TOKEN_IS, _GEO_RS),
    "decoupled_k3_rs": _preset(False, "ppo_clip", _K3_RS),
    "decoupled_k3_rs_token_tis": _preset(False, "ppo_clip", _TOKEN_IS, _K3_RS),
    "decoupled_geo_rs_seq_tis": _preset(False, "ppo_clip", _SEQ_IS, _GEO_RS),
    "decoupled_k3_rs_seq_tis": _preset(False, "ppo_clip", _SEQ_IS, _K3_RS),
    # Bypass, PPO-clip (pi_prox := pi_behav; the PPO ratio already is pi_theta / pi_behav, so no IS weights).
    "bypass_ppo_clip": _preset(True, "ppo_clip"),
    "bypass_ppo_clip_geo_rs": _preset(True, "ppo_clip", _GEO_RS),
    "bypass_ppo_clip_k3_rs": _preset(True, "ppo_clip", _K3_RS),
    # Bypass, REINFORCE with detached IS weights pi_theta / pi_behav.
    "bypass_pg_is": _preset(True, "reinforce", _SEQ_IS),
    "bypass_pg_geo_rs": _preset(True, "reinforce", _GEO_RS),
    "bypass_pg_geo_rs_token_tis": _preset(True, "reinforce", _TOKEN_IS, _GEO_RS),
    "bypass_pg_geo_rs_seq_tis": _preset(True, "reinforce", _SEQ_IS, _GEO_RS),
    # TIM paper, appendix A.4: token truncation tau_tok, then sequence rejection on sum_t K(r_corr) <= tau_seq.
    "tis_srs_k1_corr": _preset(False, "ppo_clip", _TIM_TOKEN_TIS, _TIM_SRS_K1),
    "tis_srs_k3_corr": _preset(False, "ppo_clip", _TIM_TOKEN_TIS, _TIM_SRS_K3),
    # Metrics only: decoupled PPO without any IS weight or rejection (the "naive" objective).
    "disabled": _preset(False, "ppo_clip"),
}

PRESET_NAMES: tuple[str, ...] = tuple(PRESETS)
