"""Rollout correction: rejection modes, Geo-RS length invariance, veto, batch normalisation, clamping and the
off-policy diagnostics, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.core.algo.sections import RolloutCorrectionConfig
from asyncrl.learner.algos import AlgoConfig, policy_objective
from asyncrl.learner.algos.rollout_correction import apply_rollout_correction

torch.set_num_threads(1)


def _correct(log_ratio, mask, **fields):
    return apply_rollout_correction(log_ratio, mask.bool(), RolloutCorrectionConfig(**fields))


def _drift(per_token: float, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of `per_token` log-drift, one per length, padded to the longest."""
    width = max(lengths)
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(width)] for n in lengths])
    return mask * per_token, mask


@pytest.mark.parametrize("per_token, kept", [(0.0005, True), (-0.0009, True), (0.002, False), (-0.0011, False)])
def test_geo_rs_is_length_invariant(per_token, kept):
    log_ratio, mask = _drift(per_token, [10, 100])
    corr = _correct(log_ratio, mask, weights="none", rejection="seq_mean_k1", rejection_lower=0.999,
                    rejection_upper=1.001)
    # geometric mean ratio = exp(per_token) for both lengths; inside [0.999, 1.001] iff |drift| small
    assert (0.999 <= math.exp(per_token) <= 1.001) == kept
    assert corr.rejected_sequences.tolist() == [not kept, not kept]


def test_seq_sum_k1_is_not_length_invariant_which_geo_rs_fixes():
    log_ratio, mask = _drift(0.01, [10, 100])
    corr = _correct(log_ratio, mask, weights="none", rejection="seq_sum_k1", rejection_lower=0.5,
                    rejection_upper=2.0)
    assert (math.exp(0.1) <= 2.0, math.exp(1.0) <= 2.0) == (True, False)
    assert corr.rejected_sequences.tolist() == [False, True]


def test_token_k1_bounds_each_token():
    log_ratio = torch.log(torch.tensor([[0.5, 1.0, 1.7, 2.5]]))
    corr = _correct(log_ratio, torch.ones(1, 4), rejection="token_k1", rejection_lower=0.6, rejection_upper=1.6)
    assert corr.mask.tolist() == [[False, True, False, False]]
    assert corr.rejected_sequences.tolist() == [False]


def test_k2_family_by_hand():
    log_ratio = torch.tensor([[0.1, -0.2, 0.0], [1.5, 0.0, 0.0]])
    mask = torch.ones(2, 3)
    k2 = [[0.5 * x * x for x in row] for row in log_ratio.tolist()]  # 0.005, 0.02, 0 | 1.125, 0, 0
    token = _correct(log_ratio, mask, rejection="token_k2", rejection_upper=0.01)
    assert token.mask.tolist() == [[v <= 0.01 for v in row] for row in k2]
    for mode, stat in [("seq_sum_k2", sum), ("seq_mean_k2", lambda r: sum(r) / 3), ("seq_max_k2", max)]:
        threshold = 0.4
        corr = _correct(log_ratio, mask, rejection=mode, rejection_upper=threshold)
        assert corr.rejected_sequences.tolist() == [stat(row) > threshold for row in k2], mode
    # seq_max_k2 isolates a single spike that the mean dilutes
    spike = _correct(log_ratio, mask, rejection="seq_max_k2", rejection_upper=1.0)
    diluted = _correct(log_ratio, mask, rejection="seq_mean_k2", rejection_upper=1.0)
    assert spike.rejected_sequences.tolist() == [False, True]
    assert diluted.rejected_sequences.tolist() == [False, False]


def test_k3_mean_and_sum_by_hand():
    log_ratio = torch.tensor([[0.1, -0.1, 0.0, 0.0], [0.3, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 0, 0, 0]])
    k3 = [[math.exp(x) - 1 - x for x in row] for row in log_ratio.tolist()]
    mean0, mean1 = sum(k3[0]) / 4, k3[1][0]  # 0.0025021, 0.0498588
    corr = _correct(log_ratio, mask, weights="none", rejection="seq_mean_k3", rejection_upper=0.01)
    assert corr.rejected_sequences.tolist() == [mean0 > 0.01, mean1 > 0.01] == [False, True]
    corr = _correct(log_ratio, mask, weights="none", rejection="seq_sum_k3", rejection_upper=0.006)
    assert corr.rejected_sequences.tolist() == [sum(k3[0]) > 0.006, k3[1][0] > 0.006] == [True, True]


def test_per_token_veto_rejects_the_whole_sequence():
    log_ratio = torch.log(torch.tensor([[1.0, 1e-5, 1.0], [0.5, 1.0, 1.0]]))
    corr = _correct(log_ratio, torch.ones(2, 3), veto_threshold=1e-4)
    assert corr.vetoed_sequences.tolist() == [True, False]
    assert corr.mask.tolist() == [[False] * 3, [True] * 3]


def test_batch_normalisation_gives_mean_one():
    log_ratio = torch.log(torch.tensor([[0.5, 1.0], [3.0, 1.0]]))
    corr = _correct(log_ratio, torch.ones(2, 2), weights="token", batch_normalize=True)
    raw = [0.5, 1.0, 2.0, 1.0]  # truncated at C = 2
    factor = sum(raw) / 4
    assert corr.norm_factor.item() == pytest.approx(factor)
    assert corr.weights.flatten().tolist() == pytest.approx([w / factor for w in raw])
    seq = _correct(torch.tensor([[0.2, 0.0], [0.1, 0.0]]), torch.tensor([[1.0, 1], [1, 0]]), weights="sequence",
                   batch_normalize=True)
    seq_factor = (math.exp(0.2) + math.exp(0.1)) / 2
    assert seq.weights[0, 0].item() == pytest.approx(math.exp(0.2) / seq_factor, rel=1e-5)


def test_huge_log_ratios_are_clamped_and_stay_finite():
    behav = torch.tensor([[-1e4, -1.0, -1.0]])
    prox = torch.tensor([[-1.0, -1e4, -1.0]])
    logp = prox.clone().requires_grad_()
    for preset in ("decoupled_token_is", "decoupled_seq_is", "decoupled_k3_rs", "decoupled_geo_rs"):
        loss, metrics = policy_objective(logp, prox, behav, torch.ones(1, 3), torch.ones(1, 3),
                                         AlgoConfig(preset=preset))
        assert torch.isfinite(loss) and all(math.isfinite(v) for v in metrics.values()), preset
        assert metrics["rc/delta_abs_max"] == pytest.approx(9999.0)  # the statistic is not clamped, the exps are


def test_off_policy_diagnostics_by_hand():
    delta = [[0.1, -0.2, 0.0], [0.3, 0.0, 0.0]]
    mask = [[1, 1, 1], [1, 0, 0]]
    behav = torch.full((2, 3), -1.0)
    prox = behav + torch.tensor(delta)
    _, m = policy_objective(prox.clone().requires_grad_(), prox, behav, torch.ones(2, 3), torch.tensor(mask),
                            AlgoConfig(preset="disabled"))
    tokens = [delta[i][t] for i in range(2) for t in range(3) if mask[i][t]]
    rhos = [math.exp(d) for d in tokens]
    seqs = [sum(delta[0]), delta[1][0]]
    assert m["rc/kl_k1"] == pytest.approx(sum(-d for d in tokens) / 4, abs=1e-6)
    assert m["rc/kl_k3"] == pytest.approx(sum(math.exp(d) - 1 - d for d in tokens) / 4, abs=1e-6)
    assert m["rc/chi2_token"] == pytest.approx(sum(r * r for r in rhos) / 4 - 1, abs=1e-5)
    assert m["rc/chi2_seq"] == pytest.approx(sum(math.exp(2 * s) for s in seqs) / 2 - 1, abs=1e-5)
    assert m["rc/ppl_ratio"] == pytest.approx((math.exp(-sum(delta[0]) / 3) + math.exp(-0.3)) / 2, abs=1e-6)
    assert m["rc/ess_token"] == pytest.approx(sum(rhos) ** 2 / (4 * sum(r * r for r in rhos)), abs=1e-6)
    assert m["rc/delta_mean"] == pytest.approx(sum(tokens) / 4, abs=1e-6)
    assert m["rc/delta_abs_max"] == pytest.approx(0.3, abs=1e-6)
    assert m["rc/ratio_p50"] == pytest.approx(sorted(rhos)[1] * 0.5 + sorted(rhos)[2] * 0.5, abs=1e-6)
    assert m["rc/masked_token_frac"] == 0.0 and m["rc/is_weight_mean"] == 1.0


def test_zero_centred_contribution_split_by_sign():
    behav = torch.full((2, 2), -1.0)
    prox = behav.clone()
    d = [[0.1, 0.0], [0.2, 0.0]]
    logp = (prox + torch.tensor(d)).requires_grad_()
    _, m = policy_objective(logp, prox, behav, torch.tensor([[2.0, 2.0], [-1.0, -1.0]]), torch.ones(2, 2),
                            AlgoConfig(policy_loss={"clip_eps_high": 0.5}))
    assert m["loss/contrib_pos"] == pytest.approx(-(math.exp(0.1) - 1) * 2 / 2, abs=1e-6)
    assert m["loss/contrib_neg"] == pytest.approx((math.exp(0.2) - 1) / 2, abs=1e-6)


def test_masked_quantiles_interpolate_linearly_per_row():
    from asyncrl.learner.algos.diagnostics import masked_quantiles

    rows = torch.tensor([[4.0, 1.0, 3.0, 2.0, 100.0], [5.0, 5.0, 5.0, 5.0, 5.0]])
    valid = torch.tensor([[True, True, True, True, False], [False] * 5])
    table = masked_quantiles(rows, valid, (0.5, 0.9, 0.01))
    # row 0 sorted valid values 1, 2, 3, 4: position q * 3 -> 1.5 -> 2.5; 2.7 -> 3.7; 0.03 -> 1.03
    assert table[0].tolist() == pytest.approx([2.5, 3.7, 1.03])
    assert table[1].tolist() == [0.0, 0.0, 0.0]  # nothing valid


# A row whose token log-ratios pass the +-20 clamp both ways: (-24, +21, +0.3), sum -2.7.
EXTREME = [-24.0, 21.0, 0.3]


def _extreme_objective(**rc):
    behav = torch.zeros(1, 3)
    prox = torch.tensor([EXTREME])
    cfg = AlgoConfig(rollout_correction=RolloutCorrectionConfig(**rc))
    return policy_objective(prox.clone().requires_grad_(), prox, behav, torch.ones(1, 3), torch.ones(1, 3), cfg)


def test_a_sequence_weight_clamps_the_sequence_total_not_its_tokens():
    """The seed's sequence IS weight is exp(clamp(sum_t log rho_t, -20, 20)): exp(-2.7) = 0.0672 for this row.
    Clamping each token first gave exp(-20 + 20 + 0.3) = 1.350. Geometric: exp(-2.7 / 3) = 0.4066."""
    log_ratio, mask = torch.tensor([EXTREME]), torch.ones(1, 3, dtype=torch.bool)
    seq = _correct(log_ratio, mask, weights="sequence", weight_cap=10.0)
    assert seq.weights[0, 0].item() == pytest.approx(math.exp(-2.7), rel=1e-5)  # 0.0672
    geo = _correct(log_ratio, mask, weights="geometric", weight_cap=10.0)
    assert geo.weights[0, 0].item() == pytest.approx(math.exp(-0.9), rel=1e-5)
    # Token weights clamp each token: exp(-20), min(exp(20), C), exp(0.3).
    token = _correct(log_ratio, mask, weights="token", weight_cap=10.0)
    assert token.weights[0].tolist() == pytest.approx([math.exp(-20), 10.0, math.exp(0.3)], rel=1e-5)
    # Sequence rejection on the same total: rho_seq = 0.0672 is outside [0.5, 2].
    rejected = _correct(log_ratio, mask, rejection="seq_sum_k1", rejection_lower=0.5, rejection_upper=2.0)
    assert not rejected.mask.any()


def test_the_diagnostics_sum_the_unclamped_token_log_ratios():
    """PPL ratio, KL and chi^2_seq of the same row, as the seed defines them: ppl_ratio = exp(2.7 / 3) = 2.4596
    (per-token clamping gave exp(-0.1) = 0.905), K1 = 0.9, chi^2_seq = exp(2 * -2.7) - 1."""
    _, m = _extreme_objective(weights="sequence", weight_cap=10.0)
    assert m["rc/ppl_ratio"] == pytest.approx(math.exp(0.9), rel=1e-5)
    assert m["rc/kl_k1"] == pytest.approx(0.9, rel=1e-5)
    assert m["rc/kl_k3"] == pytest.approx(sum(math.exp(d) - 1 - d for d in EXTREME) / 3, rel=1e-5)
    assert m["rc/chi2_seq"] == pytest.approx(math.exp(-5.4) - 1, rel=1e-5)
    assert m["rc/seq_log_ratio_mean"] == pytest.approx(-2.7, rel=1e-5)
    assert m["rc/is_weight_mean"] == pytest.approx(math.exp(-2.7), rel=1e-5)


def test_chi2_seq_of_a_long_biased_batch_is_reported_in_log_space():
    """Two sequences, one of 400 tokens at log-ratio 0.81 (sum 324): E[rho_seq^2] = (e^648 + 1) / 2, about
    1e281, far past float32. rc/chi2_seq_log = log of it = 648 - log 2, exactly; rc/chi2_seq (the seed's,
    each total clamped to 20) stays finite: (e^40 + 1) / 2 - 1."""
    behav = torch.zeros(2, 400)
    prox = torch.zeros(2, 400)
    prox[0] = 0.81
    mask = torch.zeros(2, 400)
    mask[0] = 1
    mask[1, :3] = 1
    cfg = AlgoConfig(rollout_correction=RolloutCorrectionConfig(weights="sequence", weight_cap=2.0))
    _, m = policy_objective(prox.clone().requires_grad_(), prox, behav, torch.ones(2, 400), mask, cfg)
    assert m["rc/chi2_seq_log"] == pytest.approx(648 - math.log(2), rel=1e-5)
    assert m["rc/chi2_seq"] == pytest.approx((math.exp(40) + 1) / 2 - 1, rel=1e-5)
    assert math.isfinite(m["rc/chi2_seq"]) and m["rc/chi2_seq"] < 3.4e38
