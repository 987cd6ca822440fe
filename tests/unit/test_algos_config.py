"""AlgoConfig: defaults, presets resolving to the documented settings, validation at load time."""

from __future__ import annotations

import math

import pytest
from pydantic import BaseModel, ValidationError

from asyncrl.core.algo.sections import RolloutCorrectionConfig
from asyncrl.learner.algos import PRESET_NAMES, AlgoConfig

# The documented table (docs/algorithms.md), written out by hand: (bypass, loss, weights, cap, rejection, lo, hi).
EXPECTED_PRESETS = {
    "decoupled_token_is": (False, "ppo_clip", "token", 2.0, "none", None, None),
    "decoupled_seq_is": (False, "ppo_clip", "sequence", 2.0, "none", None, None),
    "decoupled_seq_is_rs": (False, "ppo_clip", "sequence", 2.0, "seq_sum_k1", 0.5, 2.0),
    "decoupled_geo_rs": (False, "ppo_clip", "none", 2.0, "seq_mean_k1", 0.999, 1.001),
    "decoupled_geo_rs_token_tis": (False, "ppo_clip", "token", 2.0, "seq_mean_k1", 0.999, 1.001),
    "decoupled_k3_rs": (False, "ppo_clip", "none", 2.0, "seq_mean_k3", None, 0.01),
    "decoupled_k3_rs_token_tis": (False, "ppo_clip", "token", 2.0, "seq_mean_k3", None, 0.01),
    "decoupled_geo_rs_seq_tis": (False, "ppo_clip", "sequence", 2.0, "seq_mean_k1", 0.999, 1.001),
    "decoupled_k3_rs_seq_tis": (False, "ppo_clip", "sequence", 2.0, "seq_mean_k3", None, 0.01),
    "bypass_ppo_clip": (True, "ppo_clip", "none", 2.0, "none", None, None),
    "bypass_ppo_clip_geo_rs": (True, "ppo_clip", "none", 2.0, "seq_mean_k1", 0.999, 1.001),
    "bypass_ppo_clip_k3_rs": (True, "ppo_clip", "none", 2.0, "seq_mean_k3", None, 0.01),
    "bypass_pg_is": (True, "reinforce", "sequence", 2.0, "none", None, None),
    "bypass_pg_geo_rs": (True, "reinforce", "none", 2.0, "seq_mean_k1", 0.999, 1.001),
    "bypass_pg_geo_rs_token_tis": (True, "reinforce", "token", 2.0, "seq_mean_k1", 0.999, 1.001),
    "bypass_pg_geo_rs_seq_tis": (True, "reinforce", "sequence", 2.0, "seq_mean_k1", 0.999, 1.001),
    "tis_srs_k1_corr": (False, "ppo_clip", "token", 2.0, "seq_sum_k1", math.exp(-0.001), None),
    "tis_srs_k3_corr": (False, "ppo_clip", "token", 2.0, "seq_sum_k3", None, 0.001),
    "disabled": (False, "ppo_clip", "none", 2.0, "none", None, None),
}


def test_defaults_are_grpo_with_decoupled_token_is():
    cfg = AlgoConfig()
    assert cfg.advantage.estimator == "grpo"
    assert (cfg.bypass, cfg.policy_loss.type, cfg.policy_loss.aggregation) == (False, "ppo_clip", "token-mean")
    assert (cfg.rollout_correction.weights, cfg.rollout_correction.weight_cap) == ("token", 2.0)
    assert cfg.rollout_correction.rejection == "none"
    assert cfg.kl.mode == "none" and cfg.opd.enabled is False and cfg.length_penalty.type == "none"
    assert cfg.needs_prox_forward is True


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESETS))
def test_preset_resolves_to_documented_setting(name):
    cfg = AlgoConfig(preset=name)
    rc = cfg.rollout_correction
    bypass, loss, weights, cap, rejection, low, high = EXPECTED_PRESETS[name]
    assert (cfg.bypass, cfg.policy_loss.type, rc.weights, rc.weight_cap, rc.rejection) == (
        bypass, loss, weights, cap, rejection)
    assert rc.rejection_lower == (pytest.approx(low) if low is not None else None)
    assert rc.rejection_upper == high
    assert rc.veto_threshold is None and rc.batch_normalize is False
    assert cfg.needs_prox_forward is (not bypass)


def test_every_preset_is_documented_in_the_test_table():
    assert set(PRESET_NAMES) == set(EXPECTED_PRESETS)


def test_explicit_fields_override_the_preset_and_round_trip():
    cfg = AlgoConfig.model_validate(
        {"preset": "decoupled_geo_rs", "rollout_correction": {"rejection_upper": 1.01, "veto_threshold": 1e-4}}
    )
    rc = cfg.rollout_correction
    assert (rc.rejection, rc.rejection_lower, rc.rejection_upper, rc.veto_threshold) == (
        "seq_mean_k1", 0.999, 1.01, 1e-4)
    assert AlgoConfig.model_validate(cfg.model_dump()) == cfg
    section = AlgoConfig(preset="bypass_ppo_clip", rollout_correction=RolloutCorrectionConfig(
        weights="none", rejection="seq_mean_k3", rejection_upper=0.02))
    assert section.bypass and section.rollout_correction.rejection_upper == 0.02


@pytest.mark.parametrize("data, message", [
    ({"preset": "decoupled_tokn_is"}, "decoupled_token_is"),
    ({"rollout_correction": {"rejection": "seq_mean_k9"}}, "seq_mean_k1"),
    ({"rollout_correction": {"weights": "tokens"}}, "token"),
    ({"policy_loss": {"aggregation": "mean"}}, "token-mean"),
    ({"advantage": {"estimator": "ppo"}}, "grpo"),
    ({"rollout_correction": {"rejection": "seq_mean_k1"}}, "needs rejection_lower and/or rejection_upper"),
    ({"rollout_correction": {"rejection": "seq_mean_k1", "rejection_lower": 1.2}}, "must be <= 1"),
    ({"rollout_correction": {"rejection": "token_k1", "rejection_upper": 0.9}}, "must be >= 1"),
    ({"rollout_correction": {"rejection": "seq_mean_k3"}}, "needs rejection_upper"),
    ({"rollout_correction": {"rejection": "seq_sum_k2", "rejection_upper": 2, "rejection_lower": 0.5}},
     "from above only"),
    ({"rollout_correction": {"rejection_upper": 2.0}}, "rejection='none'"),
    ({"rollout_correction": {"rejection": "token_k2", "rejection_upper": -1}}, "greater than 0"),
    ({"rollout_correction": {"weight_cap": 0.5}}, "greater than or equal to 1"),
    ({"rollout_correction": {"veto_threshold": 1.5}}, "less than 1"),
    ({"policy_loss": {"clip_eps_low": 1.0}}, "less than 1"),
    ({"policy_loss": {"dual_clip_c": 1.0}}, "greater than 1"),
    ({"policy_loss": {"type": "reinforce"}}, "needs bypass=true"),
    ({"bypass": True}, "count the correction twice"),
    ({"opd": {"pass_rate_threshold": 1.5}}, "less than or equal to 1"),
    ({"opd": {"horizon": 0}}, "greater than or equal to 1"),
    ({"length_penalty": {"type": "anchor"}}, "needs anchor_length"),
    ({"advantage": {"dash_threshold": -0.1}}, "greater than or equal to 0"),
    ({"kl": {"mode": "penalty"}}, "reward"),
    ({"unknown_key": 1}, "Extra inputs are not permitted"),
])
def test_invalid_settings_fail_at_load_with_a_clear_message(data, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        AlgoConfig.model_validate(data)


def _sections(model: type[BaseModel]):
    yield model
    for info in model.model_fields.values():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            yield from _sections(info.annotation)


def test_every_field_has_a_description():
    for section in _sections(AlgoConfig):
        for name, info in section.model_fields.items():
            assert info.description, f"{section.__name__}.{name} has no attribute docstring"


def test_top_level_config_reads_opd_enabled():
    asyncrl_config = pytest.importorskip("asyncrl.core.config.schema")
    cfg = asyncrl_config.AsyncRLConfig()
    assert cfg.learner.algo.opd.enabled is False
    assert isinstance(cfg.learner.algo, AlgoConfig)


def test_json_schema_carries_the_field_docs():
    schema = AlgoConfig.model_json_schema()
    rc = schema["$defs"]["RolloutCorrectionConfig"]["properties"]
    assert "Per-token veto" in rc["veto_threshold"]["description"]
    assert "trainer skips the proximal forward" in schema["properties"]["bypass"]["description"]
