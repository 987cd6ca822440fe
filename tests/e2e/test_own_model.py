"""Your model, your data, your reward, and keep what you trained: the word-problems example end to end.

A Hugging Face model directory with its own BPE tokenizer and chat template (built around
examples/word_problems/tokenizer), a JSONL dataset of chat messages, a weighted reward with a user function
from a file. The run trains; its learner is SIGKILLed after a checkpoint; `asyncrl up --resume` continues from
that checkpoint (step, version and accuracy continue) and the audit finds nothing lost or trained twice. The
exported checkpoint loads in `transformers` with the final policy's log-probs, and in vLLM, which generates.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asyncrl.core.records.learner import Eval, Step
from asyncrl.core.runtime.events import read_events, read_records
from asyncrl.tools.audit import surviving
from tests.conftest import example_overrides
from tests.run_helpers import kill_learner_after

pytestmark = [pytest.mark.e2e, pytest.mark.example_model("word-problems")]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "word-problems.yaml"
STEPS, SAVE_EVERY, KILL_AFTER = 40, 20, 28


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "asyncrl.tools.cli", *args]


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("own-model")
    run_dir = root / "run"
    # The suite's build of the example's model (artifacts/tests/word-problems/, a shorter warm start: this run
    # checks mechanics): `up` builds it on first use and reuses it after, as it does for a user.
    overrides = [*example_overrides("word-problems"), f"run_dir={run_dir}", f"learner.total_steps={STEPS}", f"learner.checkpoint.save_every={SAVE_EVERY}",
                 f"learner.eval_every={SAVE_EVERY}",
                 "learner.max_restarts=0"]  # fmt: skip  (this test resumes by hand: `up --resume`)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen(cli("up", "--config", str(EXAMPLE), *[a for o in overrides for a in ("--set", o)]),
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)  # fmt: skip
    try:
        kill_learner_after(run_dir, KILL_AFTER)
        first_out, _ = first.communicate(timeout=120)
    finally:
        first.kill()
    assert first.returncode != 0 and "[up] learner failed" in first_out, first_out[-3000:]
    second = subprocess.run(cli("up", "--resume", str(run_dir)), check=False, cwd=REPO, capture_output=True, text=True,
                            timeout=900, env=env)  # fmt: skip
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    return run_dir, first_out, second.stdout


def test_the_run_learns_resumes_and_audits_clean(resumed_run):
    run_dir, _first_out, second_out = resumed_run
    assert f"resuming {run_dir} from step-0000" in second_out
    learner = read_events(run_dir, "learner")
    # Each learner start planned its memory and, on this machine, kept the background checkpoint and push.
    plans = [e for e in learner if e["kind"] == "memory_plan"]
    assert len(plans) == 2 and all(p["given_up"] == [] and p["needed"] < p["available"] for p in plans), plans
    [resumed] = [e for e in learner if e["kind"] == "resumed"]
    checkpoint_step = resumed["from_step"]
    assert checkpoint_step >= KILL_AFTER - SAVE_EVERY and checkpoint_step % SAVE_EVERY == 0
    assert resumed["version"] == checkpoint_step
    # Accuracy continues: the resumed learner's first evaluation is the checkpoint's, not the base policy's.
    at = learner.index(resumed)
    before = [e for e in learner[:at] if e["kind"] == "eval" and e["step"] == checkpoint_step]
    after = [e for e in learner[at:] if e["kind"] == "eval"]
    base = next(e for e in learner if e["kind"] == "eval")["accuracy"]
    assert after[0]["step"] == checkpoint_step and after[0]["accuracy"] == before[0]["accuracy"]
    # Step and version numbering continue to the end of the run.
    timeline = surviving(read_records(run_dir, "learner"))
    assert [e.version for e in timeline if isinstance(e, Step)] == list(range(1, STEPS + 1))
    summary = json.loads((run_dir / "summary.json").read_text())
    audit = summary["audit"]
    assert audit["ok"] and audit["lost"] == [] and audit["trained_twice"] == [], audit
    assert audit["groups_trained"] == STEPS * 8
    # Every evaluation of the surviving timeline ran (how much the example learns moves with the CPU's rounding:
    # `bench/lora_learning.py` measures it with seeds).
    evals = [e for e in timeline if isinstance(e, Eval)]
    late = [e.accuracy for e in evals if e.step > checkpoint_step]
    curve = ", ".join(f"{e.step}: {e.accuracy:.3f}" for e in evals)
    print(f"held-out score {base:.3f} (by step: {curve}), resumed at step {checkpoint_step}")
    assert len(late) == (STEPS - checkpoint_step) // SAVE_EVERY, curve


def final_checkpoint(run_dir: Path) -> Path:
    return max((run_dir / "checkpoints").glob("step-*"))


def test_the_exported_checkpoint_is_the_final_policy(resumed_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from asyncrl.core.model.modeling import load_causal_lm, sequence_logprobs
    from asyncrl.learner.checkpoint import load_checkpoint

    run_dir = resumed_run[0]
    ckpt = final_checkpoint(run_dir)
    assert ckpt.name == f"step-{STEPS:06d}"
    tokenizer = AutoTokenizer.from_pretrained(str(ckpt / "hf"))
    messages = [{"role": "user", "content": "Ada has 7 apples and gets 5 more. How many apples does Ada have now?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    sequences = [prompt + tokenizer("12", add_special_tokens=False).input_ids + [tokenizer.eos_token_id]]
    starts = [len(prompt)]
    exported = AutoModelForCausalLM.from_pretrained(str(ckpt / "hf"), dtype=torch.float32).eval()
    # The learner's final policy: its base checkpoint with the DCP state of the last step loaded into it.
    config_path = run_dir / "config.resolved.yaml"
    import yaml

    policy = load_causal_lm(yaml.safe_load(config_path.read_text())["model"]["path"])
    load_checkpoint(ckpt, policy, torch.optim.AdamW(policy.parameters()))
    want = sequence_logprobs(policy.eval(), sequences, starts, None, pad_id=tokenizer.pad_token_id)[0]
    got = sequence_logprobs(exported, sequences, starts, None, pad_id=tokenizer.pad_token_id)[0]
    assert torch.equal(got, want)


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_vllm_loads_the_exported_checkpoint_and_generates(resumed_run):
    """vLLM serves the learner's export as transformers computes it (a LoRA run's merged export is the same
    format: tests/e2e/test_lora_run.py checks it is the adapted policy)."""
    from transformers import AutoModelForCausalLM

    from asyncrl.core.config.schema import EngineConfig
    from asyncrl.core.engines.factory import make_engine
    from asyncrl.core.model.modeling import sequence_logprobs
    from asyncrl.core.model.sampling import SamplingParams
    from asyncrl.core.model.tokenizer import ModelTokenizer

    hf_dir = final_checkpoint(resumed_run[0]) / "hf"
    tokenizer = ModelTokenizer.load(hf_dir)
    prompt = tokenizer.encode_prompt(
        [{"role": "user", "content": "Ben had 9 coins and gave away 4. How many coins are left?"}]
    )
    engine = make_engine(EngineConfig(type="vllm", max_model_len=128, max_batch_size=8), str(hf_dir), "float32")
    try:
        [[greedy]] = engine.generate([prompt], SamplingParams(max_new_tokens=4, greedy=True), n=1)
        [scored] = engine.score([prompt + greedy.token_ids], [len(prompt)])
    finally:
        engine.close()
    text = tokenizer.decode_response(greedy.token_ids)
    print(f"vLLM greedy answer: {text!r}")
    assert greedy.token_ids and len(greedy.logp_behav) == len(greedy.token_ids)
    assert text.strip(), "vLLM generated nothing before the end-of-turn token"
    exported = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        [want], _ = sequence_logprobs(exported, [prompt + greedy.token_ids], [len(prompt)], None,
                                      pad_id=tokenizer.pad_id)
    assert torch.allclose(torch.tensor(scored), want[: len(scored)], atol=1e-4), (torch.tensor(scored), want)
