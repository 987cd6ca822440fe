"""The pass@k estimators beyond the unbiased one, and the pass@k reward, against values worked out by hand
from the seed's formulas ("What's in Pass@K?")."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.learner.algos import AlgoConfig, build_advantages
from asyncrl.learner.algos.evaluation import BetaFit, bernoulli_pass_at_k, fit_beta_binomial, pass_at_k_scores
from asyncrl.learner.algos.groups import Groups
from asyncrl.learner.algos.pass_at_k_reward import pass_at_k_rewards


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (8, 2, 4, 1 - 0.75**4),  # 0.68359375
    (8, 0, 100, 0.0), (8, 8, 1, 1.0),
    (4, 1, 16, 1 - 0.75**16),  # k > n: the extrapolation needs no n >= k
])  # fmt: skip
def test_the_bernoulli_extrapolation(n, c, k, expected):
    assert bernoulli_pass_at_k(n, c, k) == pytest.approx(expected, rel=1e-12)


def test_the_bernoulli_extrapolation_refuses_impossible_counts():
    with pytest.raises(ValueError, match="0 <= c <= n"):
        bernoulli_pass_at_k(4, 5, 2)


@pytest.mark.parametrize(("alpha", "beta", "k", "expected"), [
    (1.0, 1.0, 1, 1 / 2), (1.0, 1.0, 9, 9 / 10),  # uniform pass rates: 1 - 1/(k+1)
    (2.0, 3.0, 1, 0.4),  # the mean alpha / (alpha + beta)
    # 1 - B(2, 5) / B(2, 3) = 1 - (1/30) / (1/12) = 0.6, also 2 E[p] - E[p^2] = 0.8 - 6/30.
    (2.0, 3.0, 2, 0.6),
])  # fmt: skip
def test_the_beta_binomial_pass_at_k(alpha, beta, k, expected):
    assert BetaFit(alpha, beta).pass_at_k(k) == pytest.approx(expected, rel=1e-12)


def simulated(alpha: float, beta: float, prompts: int, trials: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    p = torch.distributions.Beta(alpha, beta).sample((prompts,))
    solved = torch.binomial(torch.full((prompts,), float(trials)), p, generator=g)
    return solved.long().tolist(), [trials] * prompts


def test_the_fit_recovers_the_pass_rate_distribution_and_its_pass_at_large_k():
    torch.manual_seed(0)
    solved, drawn = simulated(0.6, 2.5, prompts=3000, trials=16)
    fit = fit_beta_binomial(solved, drawn)
    assert fit.alpha == pytest.approx(0.6, rel=0.12) and fit.beta == pytest.approx(2.5, rel=0.12)
    assert fit.log_likelihood(solved, drawn) >= BetaFit(0.6, 2.5).log_likelihood(solved, drawn)
    # pass@256 from 16 samples per prompt: the fit is close to the truth, the per-prompt Bernoulli far below it
    # (a prompt never solved in 16 counts as never solvable).
    truth = BetaFit(0.6, 2.5).pass_at_k(256)
    bernoulli = sum(bernoulli_pass_at_k(n, c, 256) for c, n in zip(solved, drawn)) / len(solved)
    assert abs(fit.pass_at_k(256) - truth) < 0.03 and truth - bernoulli > 0.05


def test_the_fit_takes_prompts_with_different_trials_and_degenerate_sets():
    assert fit_beta_binomial([0, 0, 0], [8, 16, 32]).pass_at_k(1) < 1e-3  # never solved
    assert fit_beta_binomial([8, 16], [8, 16]).pass_at_k(1) > 1 - 1e-3  # always solved
    with pytest.raises(ValueError, match="0 <= successes <= trials"):
        fit_beta_binomial([3], [2])


def test_the_held_out_scores_name_each_estimate():
    scores = pass_at_k_scores([2, 0, 8], [8, 8, 8], k=4, large_k=64)
    unbiased = (1 - math.comb(6, 4) / math.comb(8, 4) + 0 + 1) / 3  # 1 - 15/70 for the first prompt
    assert scores["pass@4"] == pytest.approx(unbiased)
    assert scores["pass@4/bernoulli"] == pytest.approx((1 - 0.75**4 + 0 + 1) / 3)
    assert scores["pass@64/bernoulli"] == pytest.approx((1 - 0.75**64 + 0 + 1) / 3)
    assert {"pass@4/beta_binomial", "pass@64/beta_binomial"} <= set(scores)


def test_the_pass_at_k_reward_gives_each_sample_its_subgroups_best():
    rewards = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0])
    groups = Groups.of(torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]))
    # Group 0: subgroups (0, 1) -> 1, (0, 0) -> 0; group 1: (0.5, 0) -> 0.5, (0, 0) -> 0.
    assert pass_at_k_rewards(rewards, groups, 2).tolist() == [1.0, 1.0, 0.0, 0.0, 0.5, 0.5, 0.0, 0.0]
    assert pass_at_k_rewards(rewards, groups, 1).tolist() == rewards.tolist()
    with pytest.raises(ValueError, match="does not split into subgroups of k = 3"):
        pass_at_k_rewards(rewards, groups, 3)


def test_the_pass_at_k_reward_feeds_the_advantages_and_leaves_correctness_alone():
    rewards = torch.tensor([0.0, 1.0, 0.0, 0.0])
    mask = torch.ones(4, 3)
    cfg = AlgoConfig.model_validate({"advantage": {"pass_at_k": 2, "estimator": "drgrpo"}})
    result = build_advantages(rewards, torch.zeros(4, dtype=torch.long), mask, cfg)
    # Transformed rewards (1, 1, 0, 0), group mean 0.5: advantages +-0.5 on every token.
    assert result.advantages[:, 0].tolist() == [0.5, 0.5, -0.5, -0.5]
    assert result.metrics["reward/pass_rate"] == 0.25 and result.metrics["reward/shaped_mean"] == 0.5


@pytest.mark.parametrize(("sets", "named"), [
    ({"learner": {"algo": {"advantage": {"pass_at_k": 3}}}}, "must split sampling.group_size"),
    ({"learner": {"algo": {"advantage": {"pass_at_k": 8}}}}, "two or more subgroups"),
    ({"learner": {"eval_samples": 8, "eval_samples_max": 4}}, "eval_samples_max"),
    ({"learner": {"eval_pass_k_large": 64}}, "needs learner.eval_pass_k"),
])  # fmt: skip
def test_settings_that_cannot_work_are_refused_naming_the_key(sets, named):
    with pytest.raises(ValidationError, match=named):
        AsyncRLConfig.model_validate(sets)


def test_dynamic_n_samples_more_only_where_nothing_was_solved():
    from asyncrl.learner.held_out import draw_until_solved

    rounds = []

    def draw(indices):  # prompt 0 is solved at once, prompt 1 in the third round, prompt 2 never
        rounds.append(list(indices))
        return [{0: 3, 1: 1 if len(rounds) == 3 else 0, 2: 0}[i] for i in indices]

    solved, drawn = draw_until_solved(draw, 3, samples=4, samples_max=16)
    assert rounds == [[0, 1, 2], [1, 2], [1, 2], [2]]
    assert solved == [3, 1, 0] and drawn == [4, 12, 16]
    rounds.clear()
    assert draw_until_solved(draw, 3, samples=4, samples_max=0) == ([3, 0, 0], [4, 4, 4])  # off: one round


def test_an_evaluation_of_the_first_held_out_prompts_generates_for_those_alone(tiny_model_dir):
    """`learner.eval_prompts`: the learner's evaluation generates for the prompts it is given, in one call."""
    from asyncrl.core.model.modeling import load_causal_lm
    from asyncrl.core.model.sampling import SamplingParams
    from asyncrl.core.tasks import task_for_run
    from asyncrl.learner.held_out import evaluate_held_out

    task = task_for_run(tiny_model_dir.config)
    first = task.eval_prompts()[:3]
    generated: list[int] = []

    def on_model(generate):
        groups = generate()
        generated.append(len(groups))
        return groups

    model = load_causal_lm(str(tiny_model_dir.policy))
    result = evaluate_held_out(model, task, SamplingParams(max_new_tokens=4), on_model=on_model, prompts=first)
    assert generated == [3]  # one call, a group for each of the three prompts
    assert result["accuracy"] in {0.0, 1 / 3, 2 / 3, 1.0}
