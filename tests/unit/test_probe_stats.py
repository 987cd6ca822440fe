import math

import pytest
import torch

from asyncrl.tools.probe import mismatch_stats


def test_identical_logprobs_give_zero_mismatch():
    lp = torch.tensor([[-0.5, -1.0], [-2.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    s = mismatch_stats(lp, lp.clone(), mask)
    assert s["tokens"] == 3
    assert s["delta_abs_max"] == 0 and s["kl_engine_learner_k1"] == 0 and s["kl_engine_learner_k3"] == 0
    assert s["ppl_ratio_learner_over_engine"] == pytest.approx(1.0)


def test_hand_computed_mismatch():
    learner = torch.tensor([[-1.0, -2.0, 9.0]])
    engine = torch.tensor([[-1.5, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])  # third column is padding and must be ignored
    s = mismatch_stats(learner, engine, mask)
    # δ = [0.5, -1.0]; log r = engine - learner = [-0.5, 1.0]
    assert s["delta_mean"] == pytest.approx(-0.25)
    assert s["delta_abs_mean"] == pytest.approx(0.75)
    assert s["delta_abs_max"] == pytest.approx(1.0)
    assert s["kl_engine_learner_k1"] == pytest.approx(0.25)
    k3 = ((math.exp(0.5) - 1 - 0.5) + (math.exp(-1.0) - 1 + 1.0)) / 2
    assert s["kl_engine_learner_k3"] == pytest.approx(k3)
    # mean learner logp -1.5, mean engine logp -1.25 -> exp(0.25)
    assert s["ppl_ratio_learner_over_engine"] == pytest.approx(math.exp(0.25))
