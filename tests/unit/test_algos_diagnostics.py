"""Hand-computed checks of the sequence-level diagnostics (log space), perplexities, the geometric IS weight
and the k3 rejection modes."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.core.algo.sections import RolloutCorrectionConfig
from asyncrl.learner.algos.diagnostics import perplexity_diagnostics, rollout_diagnostics
from asyncrl.learner.algos.rollout_correction import apply_rollout_correction


def padded(rows: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    values = torch.zeros(len(rows), width, dtype=torch.float64)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        values[i, : len(row)] = torch.tensor(row, dtype=torch.float64)
        mask[i, : len(row)] = True
    return values, mask


def diagnostics(rows, **rc):
    log_ratio, mask = padded(rows)
    cfg = RolloutCorrectionConfig(**rc)
    return rollout_diagnostics(log_ratio, mask, apply_rollout_correction(log_ratio, mask, cfg), cfg.weight_cap)


def test_ppl_ratio_chi2_and_ess_on_long_sequences():
    # 400 tokens at delta 0.1 (sum 40, past the +-20 clamp) and 10 tokens at delta -0.2 (sum -2).
    # The seed clamps each sequence's total (40 -> 20) for chi^2_seq; rc/chi2_seq_log keeps the exact value.
    out = diagnostics([[0.1] * 400, [-0.2] * 10], weights="none")
    assert out["rc/ppl_ratio"].item() == pytest.approx((math.exp(-0.1) + math.exp(0.2)) / 2, rel=1e-7)
    assert out["rc/chi2_seq"].item() == pytest.approx((math.exp(40) + math.exp(-4)) / 2 - 1, rel=1e-6)
    mean_sq = (math.exp(80) + math.exp(-4)) / 2
    assert out["rc/chi2_seq_log"].item() == pytest.approx(math.log(mean_sq), rel=1e-6)
    ess = (math.exp(40) + math.exp(-2)) ** 2 / (2 * (math.exp(80) + math.exp(-4)))
    assert out["rc/ess_seq"].item() == pytest.approx(ess, rel=1e-9)
    assert out["rc/seq_log_ratio_max"].item() == pytest.approx(40.0)
    assert out["rc/seq_log_ratio_min"].item() == pytest.approx(-2.0)
    assert out["rc/seq_log_ratio_mean"].item() == pytest.approx(19.0)


def test_on_policy_sequences_give_neutral_statistics():
    out = diagnostics([[0.0] * 5, [0.0] * 3], weights="token")
    assert out["rc/ppl_ratio"].item() == pytest.approx(1.0)
    assert out["rc/chi2_seq"].item() == pytest.approx(0.0, abs=1e-12)
    assert out["rc/ess_seq"].item() == pytest.approx(1.0)
    assert out["rc/is_weight_std"].item() == pytest.approx(0.0)


def test_clipped_ess_and_weight_std():
    # rho = [4, 1]: clipped to [1/2, 2] -> [2, 1]: ESS = (2 + 1)^2 / (2 * (4 + 1)) = 0.9. Token weights
    # min(rho, 2) = [2, 1]: mean 1.5, std 0.5.
    out = diagnostics([[math.log(4.0), 0.0]], weights="token", weight_cap=2.0)
    assert out["rc/ess_token_clipped"].item() == pytest.approx(0.9)
    assert out["rc/ess_token"].item() == pytest.approx(25 / 34)
    assert out["rc/is_weight_mean"].item() == pytest.approx(1.5)
    assert out["rc/is_weight_std"].item() == pytest.approx(0.5)


def test_geometric_sequence_weight():
    log_ratio, mask = padded([[0.2, 0.4], [1.0, 1.2, 1.4]])
    corr = apply_rollout_correction(log_ratio, mask, RolloutCorrectionConfig(weights="geometric", weight_cap=2.0))
    assert corr.weights[0, :2].tolist() == pytest.approx([math.exp(0.3)] * 2)
    assert corr.weights[1].tolist() == pytest.approx([2.0] * 3)  # exp(1.2) > C
    assert corr.truncated.tolist() == [[False, False, False], [True, True, True]]


def k3(delta: float) -> float:
    return math.exp(delta) - 1 - delta


def test_token_k3_and_seq_max_k3_rejection():
    rows = [[0.5, -0.1], [-0.1, 0.05]]
    assert k3(0.5) > 0.01 > k3(-0.1) > k3(0.05)
    log_ratio, mask = padded(rows)
    token = apply_rollout_correction(log_ratio, mask, RolloutCorrectionConfig(
        weights="none", rejection="token_k3", rejection_upper=0.01))  # fmt: skip
    assert token.mask.tolist() == [[False, True], [True, True]]
    seq = apply_rollout_correction(log_ratio, mask, RolloutCorrectionConfig(
        weights="none", rejection="seq_max_k3", rejection_upper=0.01))  # fmt: skip
    assert seq.mask.tolist() == [[False, False], [True, True]]
    out = rollout_diagnostics(log_ratio, mask, seq, 2.0)
    assert out["rc/rejection_token_frac"].item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="needs rejection_upper"):
        RolloutCorrectionConfig(rejection="token_k3")


def test_training_and_rollout_perplexities():
    target, mask = padded([[-1.0, -1.0], [-2.0]])
    behav, _ = padded([[-1.5, -1.5], [-2.0]])
    out = perplexity_diagnostics(target, behav, mask)
    assert out["rc/train_log_ppl"].item() == pytest.approx(1.5)
    assert out["rc/rollout_log_ppl"].item() == pytest.approx(1.75)
    assert out["rc/log_ppl_diff"].item() == pytest.approx(-0.25)
    assert out["rc/train_ppl"].item() == pytest.approx((math.e + math.e**2) / 2)
    assert out["rc/rollout_ppl"].item() == pytest.approx((math.exp(1.5) + math.e**2) / 2)
    assert out["rc/ppl_diff"].item() == pytest.approx((math.e - math.exp(1.5)) / 2)


def test_chained_rejection_criteria_must_all_pass_and_report_their_own_fractions():
    # A: mean 0, max k3 = k3(0.1) = 0.0052 -> kept. B: mean 0.3 > ln 1.25 and k3(0.3) = 0.050 -> both reject.
    # C: mean 0 passes Geo-RS, k3(0.5) = 0.149 -> the spike filter rejects it.
    rows = [[0.1, -0.1], [0.3, 0.3], [0.5, -0.5]]
    log_ratio, mask = padded(rows)
    cfg = RolloutCorrectionConfig(weights="none", rejection="seq_mean_k1", rejection_lower=0.8, rejection_upper=1.25,
                                  more_rejections=[{"rejection": "seq_max_k3", "rejection_upper": 0.01}])  # fmt: skip
    corr = apply_rollout_correction(log_ratio, mask, cfg)
    assert corr.mask.tolist() == [[True, True], [False, False], [False, False]]
    out = rollout_diagnostics(log_ratio, mask, corr, cfg.weight_cap)
    assert out["rc/rejection_token_frac/0_seq_mean_k1"].item() == pytest.approx(1 / 3)
    assert out["rc/rejection_token_frac/1_seq_max_k3"].item() == pytest.approx(2 / 3)
    assert out["rc/rejection_token_frac"].item() == pytest.approx(2 / 3)


def test_chained_criteria_are_checked_like_the_first():
    with pytest.raises(ValueError, match="more_rejections: rejection='seq_max_k3' needs rejection_upper"):
        RolloutCorrectionConfig(more_rejections=[{"rejection": "seq_max_k3"}])
    with pytest.raises(ValueError, match="'none' is not a criterion"):
        RolloutCorrectionConfig(more_rejections=[{"rejection": "none"}])
