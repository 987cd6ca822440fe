"""Half-precision runs on one learner rank (`learner.half_precision`): float32 master weights whose rounding
runs every forward (the same bits as an engine holding the half weights), gradients that reach the masters,
and the dynamic loss scale of float16."""

from __future__ import annotations

import pytest
import torch

from asyncrl.core.config.schema import LearnerConfig, SamplingConfig
from asyncrl.core.model.modeling import load_causal_lm, sequence_logprobs
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.learner.half_precision import HalfForwards, LossScale
from asyncrl.learner.trainer import Trainer
from tests.unit.test_trainer import batch


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_forward_over_master_weights_is_the_half_models_forward(tiny_model_dir, dtype):
    masters = load_causal_lm(tiny_model_dir.policy)
    engine = load_causal_lm(tiny_model_dir.policy, dtype)  # what an engine holds: the rounded weights
    seqs, starts = [[1, 5, 6, 14, 7, 8, 2], [1, 9, 4, 3, 2]], [4, 3]
    with torch.no_grad():
        expected, _ = sequence_logprobs(engine, seqs, starts)
        with HalfForwards(dtype).running(masters):
            got, _ = sequence_logprobs(masters, seqs, starts)
    assert torch.equal(got, expected)
    assert all(p.dtype == torch.float32 for p in masters.parameters())  # put back after the forward
    # Differentiable: the gradient of a half forward lands on the float32 weights.
    with HalfForwards(dtype).running(masters):
        logp, mask = sequence_logprobs(masters, seqs, starts)
    logp[mask].sum().backward()
    grads = [p.grad for p in masters.parameters()]
    assert all(g is not None and g.dtype == torch.float32 for g in grads) and any(g.abs().sum() > 0 for g in grads)


def _changed(before, model) -> float:
    """Share of the weights' elements a step changed."""
    changed = sum(int((a != p.detach()).sum()) for a, p in zip(before, model.parameters()))
    return changed / sum(a.numel() for a in before)


def test_a_float16_learner_keeps_the_updates_float16_weights_lose(tiny_model_dir):
    """At an RL learning rate most AdamW updates are below half a float16 unit of their weight: on float16
    weights they are lost, on the float32 master weights they are kept."""
    cfg = LearnerConfig.model_validate({"lr": 1e-6})
    params = SamplingParams.from_config(SamplingConfig())
    half_weights = load_causal_lm(tiny_model_dir.policy, "float16")
    before = [p.detach().clone() for p in half_weights.parameters()]
    Trainer(half_weights, cfg, params, pad_id=0).step(batch(), version=1)
    assert _changed(before, half_weights) < 0.5

    masters = load_causal_lm(tiny_model_dir.policy)
    before = [p.detach().clone() for p in masters.parameters()]
    trainer = Trainer(masters, cfg, params, pad_id=0, half=torch.float16)
    for version in range(1, 4):
        metrics = trainer.step(batch(), version=version)
    assert all(torch.isfinite(p).all() and p.dtype == torch.float32 for p in masters.parameters())
    assert _changed(before, masters) > 0.9
    assert metrics["opt/loss_scale"] == trainer.loss_scale.scale


@pytest.mark.parametrize("updates, scale", [
    ([], 8.0),
    ([True, True], 16.0),  # two finite updates in a row: doubled
    ([True, False], 4.0),  # an overflow halves it and restarts the count
    ([False, True, True], 8.0),
    ([False] * 5, 1.0),  # never below 1
])
def test_the_loss_scale_halves_on_overflow_and_doubles_after_a_run_of_finite_updates(updates, scale):
    loss_scale = LossScale(initial=8.0, growth_interval=2)
    for finite in updates:
        loss_scale.update(finite)
    assert loss_scale.scale == scale
    assert loss_scale.scaled(torch.tensor(1.5)).item() == 1.5 * scale
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor([scale, 2 * scale])
    loss_scale.unscale_([p])
    assert p.grad.tolist() == [1.0, 2.0]


def test_bfloat16_scales_no_loss():
    off = LossScale(enabled=False)
    off.update(False)
    assert off.scale == 1.0 and off.scaled(torch.tensor(3.0)).item() == 3.0


@pytest.mark.parametrize("learner, key", [({"world_size": 2}, "learner.world_size > 1"),
                                          ({"lora": {"enabled": True}}, "learner.lora.enabled")])
def test_a_float16_learner_without_master_weights_is_refused_naming_the_keys(learner, key):
    from pydantic import ValidationError

    from asyncrl.core.config.schema import AsyncRLConfig

    with pytest.raises(ValidationError, match=f"model.dtype float16 with {key}"):
        AsyncRLConfig.model_validate({"model": {"dtype": "float16"}, "learner": learner})
    AsyncRLConfig.model_validate({"model": {"dtype": "bfloat16"}, "learner": learner})


@pytest.mark.parametrize("overrides, half", [
    ({"model": {"dtype": "float16"}}, torch.float16),
    ({"model": {"dtype": "bfloat16"}}, torch.bfloat16),
    ({"model": {"dtype": "float32"}}, None),
    ({"model": {"dtype": "bfloat16"}, "learner": {"lora": {"enabled": True}}}, None),
    ({"model": {"dtype": "bfloat16"}, "learner": {"world_size": 2}}, None),
])
def test_master_weights_are_kept_for_a_half_full_weight_learner_on_one_rank(overrides, half):
    from asyncrl.core.config.schema import AsyncRLConfig
    from asyncrl.learner.builder import master_weights_for

    assert master_weights_for(AsyncRLConfig.model_validate(overrides)) == half
