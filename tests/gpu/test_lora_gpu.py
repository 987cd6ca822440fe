"""LoRA on a CUDA GPU: an adapter pushed to a torch engine on the GPU (merged there) and to vLLM on the GPU (loaded
as a LoRA adapter), each computing what the peft-adapted policy computes. Skipped without CUDA (the CPU tier,
tests/e2e/test_vllm_lora.py and tests/integration/test_lora_push.py, covers the same code with gloo)."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from asyncrl.core.checks.weights_checksum import weights_checksum
from asyncrl.core.config.schema import EngineConfig
from asyncrl.core.lora.versions import AdapterServing
from asyncrl.push.receiving import BroadcastReceiving
from tests.e2e.conftest import build_tiny_qwen2, reference_logp
from tests.e2e.test_vllm_lora import SEQUENCES, STARTS, TARGETS, new_adapter, push_adapter

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TOL = 2e-3  # float32 on GPU kernels against the CPU transformers reference


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_qwen2(tmp_path_factory.mktemp("gpu-lora-qwen2")))


def adapted(path: str):
    from transformers import AutoModelForCausalLM

    from asyncrl.learner.adapters import inject_adapters

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    spec = inject_adapters(model, SimpleNamespace(rank=8, alpha=16.0, dropout=0.0, target_modules=TARGETS))
    return model, spec


def assert_scores_match(engine, model) -> None:
    for seq, start, got in zip(SEQUENCES, STARTS, engine.score(SEQUENCES, STARTS)):
        want = reference_logp(model, seq[:start], seq[start:], None)
        assert torch.allclose(torch.tensor(got), want, atol=TOL, rtol=0)


def test_the_torch_engine_merges_an_adapter_on_the_gpu(tiny):
    from asyncrl.core.engines.torch_engine import TorchEngine

    model, spec = adapted(tiny)
    engine = TorchEngine(EngineConfig(device="cuda"), tiny, weights=BroadcastReceiving())
    try:
        named = new_adapter(model, 1)
        stats = push_adapter(engine, named, spec, 1)
        assert stats.adapter_checksum == weights_checksum(named) == engine.adapter_checksum
        assert_scores_match(engine, model)
    finally:
        engine.close()


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_vllm_loads_an_adapter_on_the_gpu(tiny):
    from asyncrl.core.engines.vllm_engine import VLLMEngine

    model, spec = adapted(tiny)
    cfg = EngineConfig(type="vllm", max_model_len=128, max_batch_size=32, gpu_memory_utilization=0.2)
    engine = VLLMEngine(cfg, tiny, "float32", seed=0, version=0, adapters=AdapterServing(8, 2),
                        weights=BroadcastReceiving())
    try:
        named = new_adapter(model, 2)
        stats = push_adapter(engine, named, spec, 1)
        assert stats.adapter_checksum == weights_checksum(named) and stats.pause_s == 0.0
        assert_scores_match(engine, model)
    finally:
        engine.close()
