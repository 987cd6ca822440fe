"""GSPO: the clipped surrogate on the sequence-level geometric-mean ratio, hand-computed."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.learner.algos import AlgoConfig, policy_objective
from asyncrl.learner.algos.policy_loss import gspo_surrogate


def run(logp_values, prox_values, advantage, eps=0.2):
    logp = torch.tensor([logp_values], dtype=torch.float64, requires_grad=True)
    prox = torch.tensor([prox_values], dtype=torch.float64)
    mask = torch.ones_like(prox, dtype=torch.bool)
    adv = torch.full_like(prox, advantage)
    surrogate = gspo_surrogate(logp, prox, adv, mask, eps, eps, 20.0)
    surrogate.objective.mean().backward()
    return surrogate, logp.grad


def test_on_policy_sequence_ratio_is_one_and_the_gradient_is_shared_by_the_tokens():
    # delta = [0.2, -0.2]: mean 0, s = 1; d s / d logp_t = s / |y| = 0.5, objective mean over 2 tokens = s * A.
    surrogate, grad = run([-1.0, -2.0], [-1.2, -1.8], advantage=2.0)
    assert surrogate.ratio[0].tolist() == pytest.approx([1.0, 1.0])
    assert surrogate.objective[0].tolist() == pytest.approx([2.0, 2.0])
    assert grad[0].tolist() == pytest.approx([1.0, 1.0])  # A * s / |y| = 2 * 1 / 2
    assert not surrogate.clipped.any()


def test_clipping_on_the_sequence_ratio():
    surrogate, grad = run([-1.0, -1.0], [-1.5, -1.5], advantage=1.0)  # s = e^0.5 > 1.2
    assert surrogate.ratio[0, 0].item() == pytest.approx(math.exp(0.5))
    assert surrogate.objective[0].tolist() == pytest.approx([1.2, 1.2])
    assert surrogate.clipped.all() and grad.abs().max().item() == 0.0
    surrogate, grad = run([-1.5, -1.5], [-1.0, -1.0], advantage=-1.0)  # s = e^-0.5 < 0.8, A < 0
    assert surrogate.objective[0].tolist() == pytest.approx([-0.8, -0.8])
    assert surrogate.clipped.all() and grad.abs().max().item() == 0.0


def test_the_ratio_is_length_invariant():
    short, _ = run([-1.0] * 3, [-1.1] * 3, advantage=1.0, eps=10.0)
    long, _ = run([-1.0] * 300, [-1.1] * 300, advantage=1.0, eps=10.0)
    assert short.ratio[0, 0].item() == pytest.approx(math.exp(0.1)) == long.ratio[0, 0].item()


def test_gspo_through_the_objective():
    cfg = AlgoConfig(policy_loss={"type": "gspo", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4,
                                  "aggregation": "seq-mean-token-mean"},
                     rollout_correction={"weights": "none"})  # fmt: skip
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    adv = torch.tensor([[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0]])
    loss, metrics = policy_objective(logp, logp.detach(), logp.detach(), adv, mask, cfg)
    # On-policy: s = 1 everywhere, loss = -mean_i A_i = 0; the gradient pushes sequence 0 up, sequence 1 down.
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    loss.backward()
    assert logp.grad[0, :2].tolist() == pytest.approx([-0.25, -0.25])  # -(1/2 seqs) * A * s / |y| = -0.5 * 0.5
    assert logp.grad[1, 0].item() == pytest.approx(0.5)
    assert metrics["loss/clip_frac"] == 0.0


def test_gspo_token_clips_the_sequence_ratio_against_each_tokens_own_advantage():
    """Token-level advantages (2, -1) on one sequence with delta (0.2, -0.1): s = exp(0.05) = 1.0513.
    GSPO-token: o_t = s * A_t (inside the clip), d o_t / d logp_t = s * A_t, nothing to the other token.
    GSPO averages the advantages away: o = s * 0.5 on both tokens, gradient s * 0.5 / 2 per token."""
    from asyncrl.learner.algos.policy_loss import gspo_token_surrogate

    s = math.exp(0.05)
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    prox = torch.tensor([[-1.2, -1.9]], dtype=torch.float64)
    mask = torch.ones_like(prox, dtype=torch.bool)
    adv = torch.tensor([[2.0, -1.0]], dtype=torch.float64)
    token = gspo_token_surrogate(logp, prox, adv, mask, 0.2, 0.2, 20.0)
    assert token.ratio[0].tolist() == pytest.approx([s, s])
    assert token.objective[0].tolist() == pytest.approx([2 * s, -s])
    token.objective.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([2 * s, -s])
    assert not token.clipped.any()
    logp.grad = None
    sequence = gspo_surrogate(logp, prox, adv, mask, 0.2, 0.2, 20.0)
    assert sequence.objective[0].tolist() == pytest.approx([0.5 * s, 0.5 * s])
    sequence.objective.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([0.5 * s, 0.5 * s])  # 2 tokens x 0.5 s x (1 / 2)


def test_gspo_token_clips_per_token_by_the_sign_of_its_advantage():
    """s = e^0.5 > 1.2: a token with A > 0 is clipped (no gradient), one with A < 0 is not."""
    from asyncrl.learner.algos.policy_loss import gspo_token_surrogate

    logp = torch.tensor([[-1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    prox = torch.tensor([[-1.5, -1.5]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    out = gspo_token_surrogate(logp, prox, adv, torch.ones_like(prox, dtype=torch.bool), 0.2, 0.2, 20.0)
    assert out.objective[0].tolist() == pytest.approx([1.2, -math.exp(0.5)])
    assert out.clipped[0].tolist() == [True, False]
    out.objective.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, -math.exp(0.5)])


def test_gspo_token_through_the_objective_matches_gspo_with_one_advantage_per_sequence():
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.7, 0.0]], requires_grad=True)
    prox = torch.tensor([[-1.1, -1.9, 0.0], [-0.4, -0.8, 0.0]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    adv = torch.tensor([[1.0, 1.0, 0.0], [-0.5, -0.5, 0.0]])
    grads = []
    for kind in ("gspo", "gspo_token"):
        cfg = AlgoConfig(policy_loss={"type": kind, "clip_eps_low": 0.5, "clip_eps_high": 0.5,
                                      "aggregation": "seq-mean-token-mean"}, rollout_correction={"weights": "none"})
        logp.grad = None
        loss, _ = policy_objective(logp, prox, prox, adv, mask, cfg)
        loss.backward()
        grads.append(logp.grad.clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
