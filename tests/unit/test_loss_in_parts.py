"""A mini-batch trained in parts (micro-batches, ranks): each part divides by the whole mini-batch's
denominator, so the parts' losses and gradients add up to the whole's. Hand-computed values and the split
rules (groups dealt to ranks, token budgets)."""

from __future__ import annotations

import pytest
import torch

from asyncrl.core.algo.config import AlgoConfig
from asyncrl.core.config.schema import LearnerConfig
from asyncrl.learner.algos import objective_units, policy_objective
from asyncrl.learner.algos.aggregation import aggregate_loss, aggregation_units
from asyncrl.learner.sharding import SINGLE, Ranks
from tests.unit.test_trainer import batch as make_batch

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [5.0, 6.0, 0.0], [0.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]], dtype=torch.bool)


def test_denominators_by_hand():
    assert aggregation_units(MASK, "token-mean") == 6  # valid tokens
    assert aggregation_units(MASK, "seq-mean-token-sum") == 3  # sequences with a valid token
    # token-mean over the whole: 21 / 6; rows 0-1 alone over the whole's denominator: (6 + 4) / 6.
    assert aggregate_loss(LOSS, MASK, "token-mean") == pytest.approx(21 / 6)
    assert aggregate_loss(LOSS[:2], MASK[:2], "token-mean", torch.tensor(6)) == pytest.approx(10 / 6)
    # seq-mean-token-mean: (2 + 4 + 5.5) / 3 over the whole; row 2 alone: 5.5 / 3.
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-mean") == pytest.approx(11.5 / 3)
    assert aggregate_loss(LOSS[2:], MASK[2:], "seq-mean-token-mean", torch.tensor(3)) == pytest.approx(5.5 / 3)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_parts_add_up_to_the_whole_loss_and_gradient(mode):
    values = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), requires_grad=True)
    whole = aggregate_loss(values, MASK, mode)
    (grad_whole,) = torch.autograd.grad(whole, values)
    units = aggregation_units(MASK, mode)
    parts = sum(aggregate_loss(values[rows], MASK[rows], mode, units) for rows in ([0, 3], [1], [2]))
    (grad_parts,) = torch.autograd.grad(parts, values)
    assert parts.item() == pytest.approx(whole.item(), rel=1e-6)
    assert torch.allclose(grad_parts, grad_whole, atol=1e-7)
    # The local denominators (each part on its own) give another, wrong, sum.
    local = sum(aggregate_loss(values[rows], MASK[rows], mode) for rows in ([0, 3], [1], [2]))
    assert local.item() != pytest.approx(whole.item(), rel=1e-3)


def test_objective_units_are_the_denominator_policy_objective_uses():
    b = make_batch(groups=2, group_size=4, width=3)
    cfg = AlgoConfig.model_validate({"preset": "decoupled_geo_rs_token_tis"})  # rejects some sequences
    # The second group's proximal log-probs are far from its behaviour ones: Geo-RS rejects those sequences.
    noise = 0.3 * torch.randn(b.logp_behav.shape, generator=torch.Generator().manual_seed(1))
    noise[:4] = 0
    logp_prox = b.logp_behav + noise
    logp = logp_prox.clone().requires_grad_(True)
    advantages = torch.randn(b.logp_behav.shape, generator=torch.Generator().manual_seed(2))
    args = (logp, logp_prox, b.logp_behav, advantages, b.response_mask, cfg)
    own, _ = policy_objective(*args)
    units = objective_units(logp_prox, b.logp_behav, b.response_mask, cfg)
    given, _ = policy_objective(*args, units=units)
    assert units == b.response_mask[:4].sum()  # token-mean over the first group's tokens only
    assert given.item() == pytest.approx(own.item(), rel=1e-6)


def test_bypass_objectives_cannot_be_trained_in_parts():
    b = make_batch()
    with pytest.raises(ValueError, match="bypass"):
        objective_units(b.logp_behav, b.logp_behav, b.response_mask, AlgoConfig.model_validate({"preset": "bypass_pg_is"}))
    with pytest.raises(ValueError, match="learner.world_size / learner.microbatch_tokens"):
        LearnerConfig.model_validate({"microbatch_tokens": 64, "algo": {"preset": "bypass_pg_is"}})
    with pytest.raises(ValueError, match="learner.mixed_precision"):
        LearnerConfig.model_validate({"world_size": 2, "mixed_precision": "bf16"})  # on CPU


def test_groups_are_dealt_to_ranks_and_rows_cut_by_tokens():
    from asyncrl.learner.trainer import Trainer

    b = make_batch(groups=3, group_size=2, prompt=(1, 5, 6, 14), width=3)  # rows 0-5, groups 0,0,1,1,2,2
    trainer = Trainer.__new__(Trainer)
    trainer.cfg = LearnerConfig.model_validate({"microbatch_tokens": 14})
    for rank, rows in ((0, [0, 1, 4, 5]), (1, [2, 3])):
        trainer.ranks = Ranks(rank, 2)
        assert trainer.my_rows(b, list(range(6))) == rows
    trainer.ranks = SINGLE
    assert trainer.my_rows(b, [2, 3, 4]) == [2, 3, 4]
    # Sequences of 7, 6, 7, 6, 7, 6 tokens (prompt 4 + 3 or 2): at most 14 tokens per part.
    assert [len(b.sequences[r]) for r in range(6)] == [7, 6, 7, 6, 7, 6]
    assert trainer.micro_batches(b, list(range(6))) == [[0, 1], [2, 3], [4, 5]]
    trainer.cfg = LearnerConfig.model_validate({"microbatch_tokens": 5})  # a row longer than the budget: alone
    assert trainer.micro_batches(b, [0, 1]) == [[0], [1]]
