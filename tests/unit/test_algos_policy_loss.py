"""policy_objective: decoupled PPO, clipping, dual clip, REINFORCE gradient, masking, aggregation, TIM objectives.
Expected values are computed by hand from the formulas (math on Python floats), never by the implementation."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.learner.algos import PRESET_NAMES, AlgoConfig, policy_objective
from asyncrl.learner.algos.aggregation import aggregate_loss

torch.set_num_threads(1)


def _t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def _ppo_token(u: float, a: float, low: float = 0.2, high: float = 0.2) -> float:
    return min(u * a, min(max(u, 1 - low), 1 + high) * a)


def test_prox_equal_behav_gives_weight_one_and_plain_ppo():
    behav = _t([[-1.0, -2.0, -0.5], [-1.5, -0.7, -3.0]])
    d = [[0.3, -0.3, 0.0], [0.25, -0.1, 0.05]]
    adv = [[1.0] * 3, [-1.0] * 3]
    logp = (behav + _t(d)).requires_grad_()
    loss, m = policy_objective(logp, behav.clone(), behav, _t(adv), torch.ones(2, 3), AlgoConfig())
    expected = -sum(_ppo_token(math.exp(d[i][t]), adv[i][t]) for i in range(2) for t in range(3)) / 6
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["rc/is_weight_mean"] == pytest.approx(1.0) and m["rc/is_weight_max"] == pytest.approx(1.0)
    assert m["rc/kl_k1"] == pytest.approx(0.0) and m["rc/delta_abs_max"] == pytest.approx(0.0)
    assert m["loss/clip_frac"] == pytest.approx(1 / 6)  # only u = e^0.3 > 1.2 with A > 0 is clipped


def test_token_is_weights_are_truncated_at_the_cap():
    behav = _t([[-1.0, -1.0]])
    prox = behav + _t([[math.log(5.0), math.log(1.5)]])
    loss, m = policy_objective(prox.clone().requires_grad_(), prox, behav, _t([[1.0, 1.0]]), torch.ones(1, 2),
                               AlgoConfig())
    assert loss.item() == pytest.approx(-(2.0 + 1.5) / 2, abs=1e-6)  # u = 1: loss = -mean(min(rho, 2) * A)
    assert m["rc/truncated_token_frac"] == pytest.approx(0.5)
    assert m["rc/ratio_max"] == pytest.approx(5.0, rel=1e-5)


def test_sequence_is_weight_is_the_truncated_product():
    behav = torch.zeros(2, 2) - 1
    prox = behav + _t([[0.2, 0.3], [0.5, 0.5]])
    cfg = AlgoConfig(preset="decoupled_seq_is")
    loss, _ = policy_objective(prox.clone().requires_grad_(), prox, behav, torch.ones(2, 2), torch.ones(2, 2), cfg)
    assert loss.item() == pytest.approx(-(2 * math.exp(0.5) + 2 * 2.0) / 4, abs=1e-6)


@pytest.mark.parametrize("eps_high, expected", [(0.28, 1.25), (0.2, 1.2)])
def test_asymmetric_clip_upper(eps_high, expected):
    cfg = AlgoConfig(policy_loss={"clip_eps_high": eps_high})
    behav = _t([[-1.0]])
    loss, _ = policy_objective((behav + math.log(1.25)).requires_grad_(), behav, behav, _t([[1.0]]),
                               torch.ones(1, 1), cfg)
    assert loss.item() == pytest.approx(-expected, abs=1e-6)


@pytest.mark.parametrize("eps_low, expected", [(0.2, 0.8), (0.3, 0.75)])
def test_asymmetric_clip_lower(eps_low, expected):
    cfg = AlgoConfig(policy_loss={"clip_eps_low": eps_low})
    behav = _t([[-1.0]])
    loss, _ = policy_objective((behav + math.log(0.75)).requires_grad_(), behav, behav, _t([[-1.0]]),
                               torch.ones(1, 1), cfg)
    assert loss.item() == pytest.approx(expected, abs=1e-6)  # -min(u A, clip(u) A) with A = -1


def test_dual_clip_bounds_negative_advantage_loss():
    behav = _t([[-1.0]])
    logp = behav + math.log(5.0)
    plain, _ = policy_objective(logp.clone().requires_grad_(), behav, behav, _t([[-1.0]]), torch.ones(1, 1),
                                AlgoConfig())
    dual, m = policy_objective(logp.clone().requires_grad_(), behav, behav, _t([[-1.0]]), torch.ones(1, 1),
                               AlgoConfig(policy_loss={"dual_clip_c": 3.0}))
    assert plain.item() == pytest.approx(5.0, rel=1e-5)  # -min(5 * -1, 1.2 * -1)
    assert dual.item() == pytest.approx(3.0, rel=1e-5)  # -max(-5, 3 * -1)
    assert m["loss/dual_clip_frac"] == pytest.approx(1.0)


def test_weights_are_detached_no_gradient_reaches_prox_or_behav():
    behav = _t([[-1.0, -2.0]]).requires_grad_()
    prox = (behav.detach() + 0.3).requires_grad_()
    logp = prox.detach().clone().requires_grad_()
    loss, _ = policy_objective(logp, prox, behav, _t([[1.0, -0.5]]), torch.ones(1, 2), AlgoConfig())
    loss.backward()
    assert prox.grad is None and behav.grad is None
    # d loss / d logp_t = -w_t A_t / n at u = 1 (inside the clip), w_t = e^0.3 constant
    expected = [-math.exp(0.3) * 1.0 / 2, -math.exp(0.3) * -0.5 / 2]
    assert logp.grad.tolist()[0] == pytest.approx(expected, abs=1e-6)


def _cfg_for(name: str) -> AlgoConfig:
    return AlgoConfig(preset=name, kl={"mode": "loss"}, policy_loss={"dual_clip_c": 3.0})


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_masked_tokens_get_zero_gradient_even_with_garbage_padding(name):
    mask = _t([[1, 1, 0, 0], [1, 1, 1, 0]])
    behav = _t([[-1.0, -0.5, float("nan"), float("-inf")], [-0.3, -2.0, -1.0, float("inf")]])
    logp = torch.where(mask.bool(), behav + 0.0004, torch.full_like(behav, float("-inf"))).requires_grad_()
    ref = torch.where(mask.bool(), behav - 0.1, torch.full_like(behav, float("nan")))
    adv = _t([[1.0, 1.0, float("nan"), 7.0], [-1.0, -1.0, -1.0, float("inf")]])
    prox = torch.where(mask.bool(), behav, torch.full_like(behav, float("nan")))
    loss, metrics = policy_objective(logp, prox, behav, adv, mask, _cfg_for(name), logp_ref=ref)
    loss.backward()
    assert torch.isfinite(loss) and all(math.isfinite(v) for v in metrics.values())
    assert torch.isfinite(logp.grad).all()
    assert (logp.grad[~mask.bool()] == 0).all()


@pytest.mark.parametrize("name", PRESET_NAMES)
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_all_masked_batch_gives_finite_zero_loss(name, aggregation):
    cfg = AlgoConfig(preset=name, policy_loss={"aggregation": aggregation}, kl={"mode": "loss"})
    logp = torch.full((2, 3), -1.0, requires_grad=True)
    loss, metrics = policy_objective(logp, logp.detach(), logp.detach() - 5, torch.ones(2, 3), torch.zeros(2, 3),
                                     cfg, logp_ref=logp.detach())
    loss.backward()
    assert loss.item() == 0.0 and torch.isfinite(loss)
    assert (logp.grad == 0).all() and all(math.isfinite(v) for v in metrics.values())


def test_empty_batch_gives_finite_zero_loss():
    logp = torch.zeros(0, 4, requires_grad=True)
    loss, metrics = policy_objective(logp, logp.detach(), logp.detach(), torch.zeros(0, 4), torch.zeros(0, 4),
                                     AlgoConfig())
    loss.backward()
    assert loss.item() == 0.0 and all(math.isfinite(v) for v in metrics.values())


def test_aggregation_modes_by_hand():
    loss = _t([[1, 2, 3], [4, 9, 9], [5, 5, 5]])
    mask = _t([[1, 1, 1], [1, 0, 0], [0, 0, 0]]).bool()  # the empty third row counts nowhere
    assert aggregate_loss(loss, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)


def _tiny_policy(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(3, 4, 5, generator=gen)
    tokens = torch.randint(0, 6, (3, 4), generator=gen)
    weight = torch.randn(5, 6, generator=gen).requires_grad_()

    def logp_fn():
        return torch.log_softmax(features @ weight, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return weight, logp_fn


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_reinforce_gradient_is_w_a_grad_logp_with_constant_w(level):
    weight, logp_fn = _tiny_policy()
    mask = _t([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    offsets = _t([[-1.0, 0.5, 0.2, -0.4], [0.3, -0.9, 0.0, 0.0], [0.1, 0.1, -0.2, 0.0]])
    adv = _t([[1.5] * 4, [-0.5] * 4, [0.25] * 4])
    logp = logp_fn()
    behav = (logp.detach() + offsets).detach()
    cfg = AlgoConfig(bypass=True, policy_loss={"type": "reinforce"}, rollout_correction={"weights": level})
    loss, _ = policy_objective(logp, behav, behav, adv, mask, cfg)
    (autograd,) = torch.autograd.grad(loss, weight)

    values = logp.detach().tolist()
    n_valid = int(mask.sum().item())
    expected = torch.zeros_like(weight)
    for i in range(3):
        valid = [t for t in range(4) if mask[i, t] > 0]
        log_seq = sum(values[i][t] - behav[i, t].item() for t in valid)
        for t in valid:
            rho = math.exp(values[i][t] - behav[i, t].item()) if level == "token" else math.exp(log_seq)
            w = min(rho, 2.0)
            (grad_logp,) = torch.autograd.grad(logp_fn()[i, t], weight)
            expected += -w * adv[i, t].item() / n_valid * grad_logp
    assert torch.allclose(autograd, expected, atol=1e-5)


def test_tis_srs_k3_corr_rejects_on_sum_of_k3_then_truncates():
    behav = torch.full((2, 4), -1.0)
    delta = [[0.01, -0.01, 0.0, 0.0], [0.05, 0.05, -0.05, 0.0]]
    prox = behav + _t(delta)
    adv = _t([[1.0] * 4, [-1.0] * 4])
    loss, m = policy_objective(prox.clone().requires_grad_(), prox, behav, adv, torch.ones(2, 4),
                               AlgoConfig(preset="tis_srs_k3_corr"))
    k3 = [sum(math.exp(d) - 1 - d for d in row) for row in delta]
    assert k3[0] <= 0.001 < k3[1]  # the hand check of the premise: sequence 0 kept, sequence 1 rejected
    expected = -sum(min(math.exp(d), 2.0) * 1.0 for d in delta[0]) / 4  # u = 1, token-mean over kept tokens
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["rc/masked_seq_frac"] == pytest.approx(0.5)


def test_tis_srs_k1_corr_rejects_on_sum_of_k1_and_truncates_tokens():
    behav = torch.full((3, 4), -1.0)
    delta = [[1.0, 0.0, 0.0, 0.0], [-0.002, 0.0, 0.0, 0.0], [0.0005, -0.001, 0.0, 0.0]]
    prox = behav + _t(delta)
    adv = _t([[1.0] * 4, [1.0] * 4, [-1.0] * 4])
    loss, m = policy_objective(prox.clone().requires_grad_(), prox, behav, adv, torch.ones(3, 4),
                               AlgoConfig(preset="tis_srs_k1_corr"))
    kept = [i for i in range(3) if sum(-d for d in delta[i]) <= 0.001]  # K1(r) = -log r
    assert kept == [0, 2]
    expected = -sum(min(math.exp(d), 2.0) * adv[i, 0].item() for i in kept for d in delta[i]) / 8
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["rc/truncated_token_frac"] == pytest.approx(1 / 12)


def test_bypass_ppo_clip_uses_the_rollout_ratio():
    behav = _t([[-1.0, -1.0]])
    logp = (behav + _t([[0.5, 0.1]])).requires_grad_()
    loss, m = policy_objective(logp, behav, behav, _t([[1.0, 1.0]]), torch.ones(1, 2),
                               AlgoConfig(preset="bypass_ppo_clip"))
    assert loss.item() == pytest.approx(-(1.2 + math.exp(0.1)) / 2, abs=1e-6)
    assert m["rc/delta_mean"] == pytest.approx(0.3, abs=1e-6)  # bypass: delta measured against pi_theta
