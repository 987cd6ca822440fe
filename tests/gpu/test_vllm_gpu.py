"""Real vLLM on a CUDA GPU: weight updates into the running engine and routed-expert capture (R3 data).

Skipped without CUDA (the CPU tier, tests/e2e/test_vllm_engine.py, covers the rest of the engine). The NCCL
push needs two GPUs: NCCL refuses two ranks on one device, so the sender (the learner's role) sits on GPU 1
and the engine on GPU 0. On one GPU the same engine code is checked with a gloo push instead.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from asyncrl.core.config.schema import EngineConfig
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.push.receiving import BroadcastReceiving
from tests.e2e.conftest import build_tiny_qwen2, build_tiny_qwen3_moe, perturbed, push, reference_logp

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.vllm,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]

TOL = 2e-3  # float32 on GPU kernels (different reduction orders than the transformers reference)
SEQUENCES = [[3, 4, 5, 6, 7, 8, 9, 10], [12, 13, 14, 15, 16, 2, 3]]
STARTS = [3, 2]


def start_engine(path: str):
    from asyncrl.core.engines.vllm_engine import VLLMEngine

    cfg = EngineConfig(type="vllm", max_model_len=128, max_batch_size=32, gpu_memory_utilization=0.2)
    return VLLMEngine(cfg, path, "float32", seed=0, version=0, weights=BroadcastReceiving())


def reference_model(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def assert_scores_match(engine, model):
    for seq, start, got in zip(SEQUENCES, STARTS, engine.score(SEQUENCES, STARTS)):
        want = reference_logp(model, seq[:start], seq[start:], None)
        assert torch.allclose(torch.tensor(got), want, atol=TOL, rtol=0)


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    path = str(build_tiny_qwen2(tmp_path_factory.mktemp("gpu-qwen2")))
    engine = start_engine(path)
    yield engine, reference_model(path)
    engine.close()


def test_logp_behav_matches_the_learner_on_gpu(dense):
    # On GPU vLLM truncates with its Triton top-k/top-p kernel, not the PyTorch one the CPU tier checks.
    engine, model = dense
    params = SamplingParams(temperature=0.7, top_k=8, top_p=0.9, max_new_tokens=12)
    prompts = [[3, 4, 5, 6], [7, 8, 9]]
    for prompt, group in zip(prompts, engine.generate(prompts, params, n=4)):
        for gen in group:
            want = reference_logp(model, prompt, gen.token_ids, params)
            assert torch.allclose(torch.tensor(gen.logp_behav), want, atol=TOL, rtol=0)


def test_gloo_push_updates_the_gpu_engine(dense):
    engine, model = dense
    assert_scores_match(engine, model)
    new_model = perturbed(model, seed=1)
    stats, plan = push(engine, new_model, version=engine.weight_version + 1)
    assert stats.bytes_received == plan.total_bytes and engine.weight_version == plan.version
    assert_scores_match(engine, new_model)
    [[gen]] = engine.generate([[3, 4, 5]], SamplingParams(temperature=0.7, top_k=8, max_new_tokens=8))
    assert set(gen.weight_version) == {plan.version}


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs two GPUs (one rank per device)")
def test_nccl_push_updates_the_gpu_engine(dense):
    engine, model = dense
    new_model = perturbed(model, seed=2)
    stats, plan = push(
        engine, new_model, version=engine.weight_version + 1, transport="nccl", device="cuda:1"
    )
    print(f"nccl push: load_s={stats.load_s:.3f} pause_s={stats.pause_s:.3f} extra={stats.extra}")
    assert stats.bytes_received == plan.total_bytes and engine.weight_version == plan.version
    assert_scores_match(engine, new_model)


def assert_r3_reproduces_logp_behav(model, prompt, gen):
    """vLLM's routed experts through the trajectory proto and the learner's batch, forced in the learner's
    forward (R3): the learner's log-probs match the engine's logp_behav."""
    from asyncrl.core.buffer import BufferEntry
    from asyncrl.core.model.modeling import sequence_logprobs
    from asyncrl.core.model.routing import install_hooks
    from asyncrl.learner.batch import assemble
    from asyncrl.rollout.trajectories import build_group

    hooks = install_hooks(model)
    group = build_group(group_id="g", prompt_index=0, prompt_token_ids=prompt, generations=[gen], rewards=[0.0],
                        replica_id="r", lease_id="l", metadata={})
    batch = assemble([BufferEntry("1-0", group)], hooks.shape)
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    with torch.no_grad(), hooks.force(batch.routing, batch.routing_mask):
        logp, mask = sequence_logprobs(model, batch.sequences, batch.response_starts, params)
    assert torch.allclose(logp[mask], batch.logp_behav[mask], atol=TOL, rtol=0)
    hooks.remove()


def test_moe_routed_experts_and_weight_update(tmp_path_factory, dense):
    # One engine on the GPU at a time: the dense one (last used above) goes first; closing twice is harmless.
    dense[0].close()
    path = str(build_tiny_qwen3_moe(tmp_path_factory.mktemp("gpu-qwen3-moe")))
    engine = start_engine(path)
    try:
        assert engine.returns_routed_experts
        model = reference_model(path)
        prompt = [3, 4, 5, 6]
        [[gen]] = engine.generate([prompt], SamplingParams(temperature=1.0, max_new_tokens=8))
        routed = gen.routed_experts.ids if gen.routed_experts is not None else None
        assert routed is not None, "vLLM returned no routed experts"
        print(f"routed_experts shape {routed.shape} for {len(prompt)} prompt + {len(gen.token_ids)} tokens")
        # [positions, MoE layers, top-k]: one row per token the model ran (the last sampled one may be absent).
        assert routed.shape[1:] == (2, 2)
        assert len(prompt) + len(gen.token_ids) - 1 <= routed.shape[0] <= len(prompt) + len(gen.token_ids)
        assert routed.min() >= 0 and routed.max() < 8
        assert_r3_reproduces_logp_behav(model, prompt, gen)
        # The in-memory names of a transformers 5 MoE (fused experts) are what a learner pushes.
        new_model = perturbed(model, seed=3)
        stats, _ = push(engine, new_model, version=1)
        assert stats.version == engine.weight_version == 1
        assert_scores_match(engine, new_model)
    finally:
        engine.close()
