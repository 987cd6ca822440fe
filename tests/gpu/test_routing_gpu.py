"""Routing replay on a CUDA GPU: the torch engine captures routing on the device, the learner's forced forward
reproduces the engine's log-probs there, and with a bfloat16 rollout against a float32 learner (the usual
numerics mismatch) R3 removes the routing part of the gap.

Skipped without CUDA. (vLLM's own routed-experts capture -> R3 is `test_vllm_gpu.py`, which also needs vLLM.)
"""

from __future__ import annotations

import pytest
import torch

from asyncrl.core.engines.torch_decode import generate_with_model
from asyncrl.core.model.modeling import sequence_logprobs
from asyncrl.core.model.routing import install_hooks, routing_mismatch
from asyncrl.core.model.sampling import SamplingParams
from tests.unit.test_routing import TOP_K, padded, tiny_moe

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=12)
PROMPTS = [[2, 3 + i % 20, 5 + i % 7, 9] for i in range(64)]


def rollout(model, hooks, seed=0):
    gens = [g for row in generate_with_model(model, PROMPTS, PARAMS, 4, eos_ids=[1], pad_id=0,
                                             generator=torch.Generator("cuda").manual_seed(seed),
                                             router_hooks=hooks) for g in row]
    prompt_of = [p for p in PROMPTS for _ in range(4)]
    sequences = [p + g.token_ids for p, g in zip(prompt_of, gens)]
    starts = [len(p) for p in prompt_of]
    behav = torch.zeros(len(gens), PARAMS.max_new_tokens)
    for i, g in enumerate(gens):
        behav[i, : len(g.logp_behav)] = torch.tensor(g.logp_behav)
    forced, mask = padded([g.routed_experts.ids for g in gens], max(len(s) for s in sequences))
    return sequences, starts, behav.cuda(), forced.cuda(), mask.cuda()


def deltas(model, hooks, sequences, starts, behav, forced, mask):
    """(mean |logp - logp_behav| without replay, with R3, the routing mismatch per layer)."""
    with torch.no_grad(), hooks.capture() as natural:
        own_logp, resp = sequence_logprobs(model, sequences, starts, PARAMS)
    own = torch.stack(natural, dim=-2).view(len(sequences), -1, 2, TOP_K)
    with torch.no_grad(), hooks.force(forced, mask):
        replayed_logp, _ = sequence_logprobs(model, sequences, starts, PARAMS)
    target = behav[:, : own_logp.shape[1]][resp]
    return ((own_logp[resp] - target).abs().mean().item(), (replayed_logp[resp] - target).abs().mean().item(),
            routing_mismatch(own, forced, mask).tolist())


def test_cuda_capture_and_replay_match_the_engine():
    model = tiny_moe(layers=2).cuda()
    hooks = install_hooks(model)
    data = rollout(model, hooks)
    unreplayed, replayed, mismatch = deltas(model, hooks, *data)
    print(f"cuda float32 both sides: |delta| unreplayed {unreplayed:.2e} replayed {replayed:.2e} "
          f"mismatch per layer {mismatch}")
    assert replayed < 2e-3


def test_r3_closes_the_routing_gap_of_a_bf16_rollout():
    rollout_model = tiny_moe(layers=2).cuda().to(torch.bfloat16)
    data = rollout(rollout_model, install_hooks(rollout_model))
    learner = tiny_moe(layers=2).cuda()  # same seed: the float32 weights the bf16 engine was cast from
    unreplayed, replayed, mismatch = deltas(learner, install_hooks(learner), *data)
    print(f"bf16 rollout vs float32 learner: |delta| unreplayed {unreplayed:.4f} replayed {replayed:.4f} "
          f"mismatch per layer {mismatch}")
    assert max(mismatch) > 0 and replayed < unreplayed
