"""OPD (eligibility, horizon, KL-as-advantage, KL-as-loss, teacher alignment) and KL to the reference
(k1/k2/k3, loss form with its IS correction), checked against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.learner.algos import AlgoConfig, build_advantages, policy_objective

torch.set_num_threads(1)

# Two prompts of three samples: group 0 passes 1/3 (hard), group 1 passes 2/3 (not hard at threshold 0.5).
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
GROUPS = torch.tensor([0, 0, 0, 1, 1, 1])
MASK = torch.tensor([[1.0, 1, 1, 1]] * 2 + [[1.0, 1, 1, 0]] + [[1.0, 1, 1, 1]] * 3)
LOGP = torch.tensor([[-1.0, -0.5, -2.0, -1.0]] * 6) + torch.arange(6).view(-1, 1) * 0.1
TEACHER = LOGP + torch.tensor([0.4, -0.2, 0.3, 0.1])


def _opd_cfg(**opd) -> AlgoConfig:
    return AlgoConfig(opd={"enabled": True, **opd})


def test_eligibility_is_failed_rollouts_of_hard_prompts_within_the_horizon():
    result = build_advantages(REWARDS, GROUPS, MASK, _opd_cfg(horizon=2, normalize=False), logp_prox=LOGP,
                              logp_teacher=TEACHER)
    expected_mask = torch.zeros(6, 4, dtype=torch.bool)
    expected_mask[1:3, :2] = True  # sequences 1 and 2 (failed, group pass rate 1/3 < 0.5), first 2 tokens
    assert torch.equal(result.opd_mask, expected_mask)
    assert result.metrics["opd/eligible_frac"] == pytest.approx(2 / 6)
    assert result.metrics["opd/hard_seq_frac"] == pytest.approx(3 / 6)


def test_kl_as_advantage_replaces_rl_advantages_of_eligible_sequences():
    result = build_advantages(REWARDS, GROUPS, MASK, _opd_cfg(horizon=2, normalize=False), logp_prox=LOGP,
                              logp_teacher=TEACHER)
    adv = result.advantages
    # eligible: A_t = -(logp - logp_teacher) on the first two tokens, 0 after the horizon
    assert adv[1].tolist() == pytest.approx([0.4, -0.2, 0.0, 0.0], abs=1e-6)
    assert adv[2].tolist() == pytest.approx([0.4, -0.2, 0.0, 0.0], abs=1e-6)
    # everyone else keeps GRPO: group 0 mean 1/3, std sqrt(1/3); group 1 mean 2/3, std sqrt(1/3)
    s = math.sqrt(1 / 3)
    assert adv[0, 0].item() == pytest.approx((2 / 3) / s, abs=1e-5)
    assert adv[3:, 0].tolist() == pytest.approx([(1 / 3) / s, (1 / 3) / s, -(2 / 3) / s], abs=1e-5)


def test_opd_advantages_are_normalised_separately():
    result = build_advantages(REWARDS, GROUPS, MASK, _opd_cfg(horizon=2), logp_prox=LOGP, logp_teacher=TEACHER)
    gaps = [0.4, -0.2, 0.4, -0.2]  # the four OPD tokens
    mean = sum(gaps) / 4
    std = math.sqrt(sum((g - mean) ** 2 for g in gaps) / 3)
    z = [(g - mean) / (std + 1e-6) for g in gaps]
    assert result.advantages[1:3, :2].flatten().tolist() == pytest.approx(z, abs=1e-5)
    s = math.sqrt(1 / 3)
    assert result.advantages[3, 0].item() == pytest.approx((1 / 3) / s, abs=1e-5)  # RL side untouched


def test_kl_as_loss_k2_with_coefficient():
    cfg = _opd_cfg(mode="loss", coef=0.5)
    adv = build_advantages(REWARDS, GROUPS, MASK, cfg, logp_prox=LOGP, logp_teacher=TEACHER)
    logp = LOGP.clone().requires_grad_()
    loss, m = policy_objective(logp, LOGP, LOGP, torch.zeros(6, 4), MASK, cfg, logp_teacher=TEACHER,
                               opd_mask=adv.opd_mask)
    loss.backward()
    diffs = [-0.4, 0.2, -0.3, -0.1]  # logp - logp_teacher per position
    opd_tokens = [(1, t) for t in range(4)] + [(2, t) for t in range(3)]  # no horizon; row 2 has 3 tokens
    n_valid = int(MASK.sum().item())
    expected = sum(0.5 * 0.5 * diffs[t] ** 2 for _, t in opd_tokens) / n_valid
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["loss/opd"] == pytest.approx(expected, abs=1e-6)
    expected_grad = torch.zeros(6, 4)
    for i, t in opd_tokens:
        expected_grad[i, t] = 0.5 * diffs[t] / n_valid  # d/dlogp of beta * 0.5 d^2 / n
    assert torch.allclose(logp.grad, expected_grad, atol=1e-6)


def test_kl_as_loss_needs_the_opd_mask():
    cfg = _opd_cfg(mode="loss")
    with pytest.raises(ValueError, match="opd_mask"):
        policy_objective(LOGP.clone().requires_grad_(), LOGP, LOGP, torch.zeros(6, 4), MASK, cfg,
                         logp_teacher=TEACHER)


@pytest.mark.parametrize("bad", [TEACHER[:, :3], torch.zeros(6, 6), TEACHER[:5]])
def test_misaligned_teacher_logprobs_fail_with_a_clear_error(bad):
    with pytest.raises(ValueError, match="logp_teacher has shape .* aligned to the response tokens"):
        build_advantages(REWARDS, GROUPS, MASK, _opd_cfg(), logp_prox=LOGP, logp_teacher=bad)
    with pytest.raises(ValueError, match="logp_teacher has shape"):
        policy_objective(LOGP.clone().requires_grad_(), LOGP, LOGP, torch.zeros(6, 4), MASK,
                         _opd_cfg(mode="loss"), logp_teacher=bad, opd_mask=MASK.bool())


def test_missing_teacher_logprobs_fail():
    with pytest.raises(ValueError, match="logp_teacher is None"):
        build_advantages(REWARDS, GROUPS, MASK, _opd_cfg(), logp_prox=LOGP)


def _kl_loss(estimator: str, correction: bool, log_u: float) -> tuple[float, dict]:
    cfg = AlgoConfig(kl={"mode": "loss", "estimator": estimator, "coef": 0.1, "loss_is_correction": correction})
    logp = torch.tensor([[-1.0]], requires_grad=True)
    prox = logp.detach() - log_u
    loss, m = policy_objective(logp, prox, prox, torch.zeros(1, 1), torch.ones(1, 1), cfg,
                               logp_ref=torch.tensor([[-1.5]]))
    return loss.item(), m


@pytest.mark.parametrize("estimator, value", [
    ("k1", 0.5),                              # log pi - log pi_ref
    ("k2", 0.5 * 0.5 ** 2),                   # 0.5 (log pi - log pi_ref)^2
    ("k3", math.exp(-0.5) - 1 + 0.5),         # r - 1 - log r, r = pi_ref / pi = e^-0.5
])
def test_kl_estimators_as_loss(estimator, value):
    loss, m = _kl_loss(estimator, correction=False, log_u=0.0)
    assert loss == pytest.approx(0.1 * value, abs=1e-7)
    assert m["kl/ref_k1"] == pytest.approx(0.5) and m["kl/ref_k3"] == pytest.approx(math.exp(-0.5) - 0.5)


def test_kl_loss_importance_correction_uses_the_clipped_ratio():
    k3 = math.exp(-0.5) - 1 + 0.5
    at_prox, _ = _kl_loss("k3", correction=True, log_u=0.0)
    moved, _ = _kl_loss("k3", correction=True, log_u=math.log(1.5))
    shrunk, _ = _kl_loss("k3", correction=True, log_u=math.log(0.5))
    assert at_prox == pytest.approx(0.1 * k3, abs=1e-7)            # u = 1
    assert moved == pytest.approx(0.1 * max(1.5 * k3, 1.2 * k3), abs=1e-7)
    assert shrunk == pytest.approx(0.1 * max(0.5 * k3, 0.8 * k3), abs=1e-7)


def test_kl_loss_needs_logp_ref():
    with pytest.raises(ValueError, match="logp_ref"):
        policy_objective(torch.zeros(1, 1, requires_grad=True), torch.zeros(1, 1), torch.zeros(1, 1),
                         torch.zeros(1, 1), torch.ones(1, 1), AlgoConfig(kl={"mode": "loss"}))


def test_garbage_on_padding_never_reaches_the_advantages():
    pad = ~MASK.bool()
    nan = torch.full_like(LOGP, float("nan"))
    cfg = AlgoConfig(opd={"enabled": True, "horizon": 3}, kl={"mode": "reward"},
                     advantage={"token_level": True})
    result = build_advantages(REWARDS, GROUPS, MASK, cfg, logp_prox=torch.where(pad, nan, LOGP),
                              logp_teacher=torch.where(pad, -nan.abs(), TEACHER),
                              logp_ref=torch.where(pad, nan, LOGP - 0.1), token_rewards=torch.where(pad, nan, LOGP))
    assert torch.isfinite(result.advantages).all() and (result.advantages[pad] == 0).all()
    assert all(math.isfinite(v) for v in result.metrics.values())
