"""build_advantages: estimators, token-level variant, DASH, KL in reward, length penalties; pass@k.
Expected values are worked out by hand from the formulas."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.learner.algos import AlgoConfig, build_advantages, pass_at_k

torch.set_num_threads(1)

REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
GROUPS = torch.tensor([0, 0, 0, 0, 7, 7, 7, 7])  # any ids; equal id = same prompt


def _seq_adv(estimator: str) -> list[float]:
    result = build_advantages(REWARDS, GROUPS, torch.ones(8, 3), AlgoConfig(advantage={"estimator": estimator}))
    assert (result.advantages == result.advantages[:, :1]).all()  # outcome advantage broadcast over tokens
    return result.advantages[:, 0].tolist()


def test_grpo_by_hand():
    # group 0: mean 0.5, Bessel std sqrt(1/3); group 7: mean 0.75, std 0.5
    a, b = 0.5 / math.sqrt(1 / 3), 0.25 / 0.5
    assert _seq_adv("grpo") == pytest.approx([a, -a, -a, a, b, b, b, -1.5], abs=1e-5)


def test_drgrpo_by_hand():
    assert _seq_adv("drgrpo") == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.25, 0.25, 0.25, -0.75], abs=1e-6)


def test_rloo_by_hand():
    assert _seq_adv("rloo") == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3, 1 / 3, 1 / 3, 1 / 3, -1.0], abs=1e-6)


def test_reinforce_whitens_over_the_batch():
    mean = 5 / 8
    std = math.sqrt((5 * (1 - mean) ** 2 + 3 * mean ** 2) / 7)
    expected = [((r - mean) / std) for r in REWARDS.tolist()]
    assert _seq_adv("reinforce") == pytest.approx(expected, abs=1e-5)


def test_singleton_group_has_no_baseline():
    result = build_advantages(torch.tensor([0.7]), torch.tensor([3]), torch.ones(1, 2), AlgoConfig())
    assert result.advantages.flatten().tolist() == pytest.approx([0.7, 0.7], abs=1e-5)


def test_padding_gets_zero_advantage():
    mask = torch.tensor([[1.0, 1, 0], [1, 0, 0]])
    result = build_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), mask, AlgoConfig())
    assert result.advantages[~mask.bool()].abs().sum() == 0


def test_token_level_variant_keeps_per_token_credit():
    rewards, groups, mask = torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.ones(2, 3)
    token_rewards = torch.tensor([[0.1, 0.0, 0.2], [0.0, 0.0, -0.3]])
    cfg = AlgoConfig(advantage={"estimator": "grpo", "token_level": True})
    result = build_advantages(rewards, groups, mask, cfg, token_rewards=token_rewards)
    outcome = 0.5 / (math.sqrt(0.5) + 1e-6)  # group of two: mean 0.5, Bessel std sqrt(0.5), eps 1e-6
    values = token_rewards.flatten().tolist()
    mu = sum(values) / 6
    sd = math.sqrt(sum((v - mu) ** 2 for v in values) / 5)
    z = [[(v - mu) / (sd + 1e-6) for v in row] for row in token_rewards.tolist()]
    expected = [[sign * outcome + sum(z[i][t:]) for t in range(3)] for i, sign in ((0, 1), (1, -1))]
    assert result.advantages.flatten().tolist() == pytest.approx([v for row in expected for v in row], abs=1e-5)
    # without token_level the token rewards are summed into the scalar first: R = [1.3, -0.3]
    flat = build_advantages(rewards, groups, mask, AlgoConfig(advantage={"estimator": "drgrpo"}),
                            token_rewards=token_rewards)
    assert flat.advantages.flatten().tolist() == pytest.approx([0.8] * 3 + [-0.8] * 3, abs=1e-6)


def test_dash_drops_small_advantages_and_counts_them():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.52])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    cfg = AlgoConfig(advantage={"estimator": "drgrpo", "dash_threshold": 0.1})
    result = build_advantages(rewards, groups, torch.ones(6, 2), cfg)
    # |A| = 0.5, 0.5 | 0, 0 | 0.01, 0.01 -> the last four are below 0.1
    assert result.keep.tolist() == [True, True, False, False, False, False]
    assert result.advantages[2:].abs().sum() == 0
    assert result.metrics["adv/dash_dropped"] == 4.0
    assert result.metrics["adv/dash_dropped_frac"] == pytest.approx(4 / 6)


def test_kl_in_reward_subtracts_the_summed_penalty():
    logp_prox = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]])
    logp_ref = torch.tensor([[-1.5, -2.0], [-0.5, -1.5]])
    cfg = AlgoConfig(kl={"mode": "reward", "estimator": "k1", "coef": 0.1}, advantage={"estimator": "drgrpo"})
    result = build_advantages(torch.tensor([1.0, 1.0]), torch.tensor([0, 0]), torch.ones(2, 2), cfg,
                              logp_prox=logp_prox, logp_ref=logp_ref)
    shaped = [1 - 0.1 * (0.5 + 0.0), 1 - 0.1 * (0.0 + 1.0)]  # k1 = logp - logp_ref per token, summed
    mean = sum(shaped) / 2
    assert result.advantages[:, 0].tolist() == pytest.approx([s - mean for s in shaped], abs=1e-6)
    assert result.metrics["kl/ref_kl"] == pytest.approx(1.5 / 4)
    with pytest.raises(ValueError, match="logp_ref"):
        build_advantages(torch.tensor([1.0, 1.0]), torch.tensor([0, 0]), torch.ones(2, 2), cfg, logp_prox=logp_prox)


def _lengths_mask(lengths: list[int]) -> torch.Tensor:
    width = max(lengths)
    return torch.tensor([[1.0 if t < n else 0.0 for t in range(width)] for n in lengths])


def _shaped(penalty: dict, rewards: list[float], lengths: list[int], groups: list[int], **kwargs) -> list[float]:
    cfg = AlgoConfig(length_penalty=penalty)
    result = build_advantages(torch.tensor(rewards), torch.tensor(groups), _lengths_mask(lengths), cfg, **kwargs)
    return result.shaped_rewards.tolist()


def test_uniform_length_penalty():
    assert _shaped({"type": "uniform", "alpha": 0.01}, [1.0, 0.0], [10, 20], [0, 0]) == pytest.approx([0.9, -0.2])


def test_group_length_penalty_kimi():
    # lambda = 0.5 - (L - 10) / 20 = 0.5, 0, -0.5; the incorrect one only gets min(0, lambda)
    got = _shaped({"type": "group", "beta": 0.1}, [1.0, 1.0, 0.0, 1.0, 0.0], [10, 20, 30, 5, 5], [0, 0, 0, 1, 1])
    assert got == pytest.approx([1.05, 1.0, -0.05, 1.0, 0.0])  # group 1: equal lengths, lambda = 0


def test_anchor_length_penalty():
    got = _shaped({"type": "anchor", "gamma": 0.01, "anchor_length": 100}, [1.0, 1.0], [150, 80], [0, 0])
    assert got == pytest.approx([1 - 0.01 * 0.5, 1.0])
    per_sequence = _shaped({"type": "anchor", "gamma": 0.01, "anchor_length": 100}, [1.0, 1.0], [150, 80], [0, 0],
                           anchor_lengths=torch.tensor([150.0, 40.0]))
    assert per_sequence == pytest.approx([1.0, 1 - 0.01 * 1.0])


def test_reward_and_length_metrics():
    result = build_advantages(torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0, 0, 1]), _lengths_mask([3, 1, 2]),
                              AlgoConfig())
    m = result.metrics
    assert (m["reward/mean"], m["reward/min"], m["reward/max"]) == pytest.approx((1.0, 0.0, 2.0))
    assert (m["response/length_mean"], m["response/length_min"], m["response/length_max"]) == (2.0, 1.0, 3.0)
    assert m["reward/pass_rate"] == pytest.approx(2 / 3)


def test_misaligned_inputs_fail_clearly():
    with pytest.raises(ValueError, match="rewards has shape"):
        build_advantages(torch.ones(3), torch.zeros(2, dtype=torch.long), torch.ones(2, 4), AlgoConfig())
    with pytest.raises(ValueError, match="logp_prox has shape"):
        build_advantages(torch.ones(2), torch.zeros(2, dtype=torch.long), torch.ones(2, 4), AlgoConfig(),
                         logp_prox=torch.zeros(2, 5))


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 2, 1 - 3 / 10),          # 1 - C(3,2)/C(5,2)
    (10, 3, 1, 0.3),                # pass@1 = c / n
    (10, 0, 5, 0.0),
    (4, 3, 2, 1.0),                 # n - c < k: every pair holds a correct sample
    (100, 10, 10, 1 - math.comb(90, 10) / math.comb(100, 10)),
])
def test_pass_at_k_unbiased_estimator(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("n, c, k", [(5, 6, 1), (5, 2, 0), (5, 2, 6), (0, 0, 1), (5, -1, 1)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_anchor_candidates_come_from_competent_groups_only():
    from asyncrl.learner.algos.shaping import anchor_candidates

    lengths = torch.tensor([10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    correct = torch.tensor([True, True, True, True, False, True])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    # group 0 passes 3/3 > 0.9 -> anchor = mean correct length 20; group 1 passes 2/3 -> no anchor yet
    assert anchor_candidates(lengths, correct, groups, competence=0.9) == {0: 20.0}
