"""A LoRA run of the demo (`learner.lora`), end to end: only the adapter is pushed (every push, its bytes), every
replica is verified serving it, the learner killed with SIGKILL mid-run is restarted by `up` and resumes training
the adapter from its checkpoint (step, version and accuracy continue), and the final checkpoint holds the
adapter in peft's format and a merged Hugging Face export that computes what the adapted policy computes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import yaml

from asyncrl.core.model.modeling import load_causal_lm, named_weights, sequence_logprobs
from asyncrl.core.runtime.events import read_events
from tests.e2e.test_system import DEMO_CONFIG, REPO
from tests.run_helpers import kill_learner_after, running_up

pytestmark = pytest.mark.e2e

STEPS, SAVE_EVERY, KILL_AFTER = 40, 10, 15


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("lora") / "run"
    overrides = [f"run_dir={run_dir}", f"learner.total_steps={STEPS}", f"learner.checkpoint.save_every={SAVE_EVERY}",
                 f"learner.eval_every={SAVE_EVERY}", "learner.lora.enabled=true", "learner.lora.rank=8",
                 "learner.lr=1.0e-3"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("ASYNCRL_TOKEN", "ASYNCRL_LEARNER_SECRET")}
    with running_up("--config", str(DEMO_CONFIG), *[a for o in overrides for a in ("--set", o)], env=env) as proc:
        kill_learner_after(run_dir, KILL_AFTER)
        out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0 and "[up] audit OK" in out, out[-4000:]
    return run_dir


def base_policy(run_dir: Path) -> Path:
    """The run's model.path (the base the adapter trains on)."""
    path = Path(yaml.safe_load((run_dir / "config.resolved.yaml").read_text())["model"]["path"])
    return path if path.is_absolute() else REPO / path


def test_only_the_adapter_is_pushed_and_every_replica_serves_it(lora_run):
    pushes = [e for e in read_events(lora_run, "learner") if e["kind"] == "push" and e["receivers"]]
    full = sum(t.numel() * t.element_size() for _, t in named_weights(load_causal_lm(base_policy(lora_run))))
    assert pushes and len({p["push_bytes"] for p in pushes}) == 1 and pushes[0]["push_bytes"] < full / 4
    committed = [e for e in read_events(lora_run, "controller") if e["kind"] == "push_committed"]
    assert all(e["dropped"] == [] for e in committed if e["version"] > 1)
    assert not [e for e in read_events(lora_run, "controller") if e["kind"] == "replica_dropped"
                and "did not take effect" in e["error"]]


def test_a_killed_lora_learner_resumes_training_its_adapter(lora_run):
    learner = read_events(lora_run, "learner")
    [resumed] = [e for e in learner if e["kind"] == "resumed"]
    # Killed once KILL_AFTER steps were seen (polled: a fast learner may have checkpointed the next SAVE_EVERY
    # by then), it resumes from its latest checkpoint, at that checkpoint's step and version.
    start = resumed["from_step"]
    assert start % SAVE_EVERY == 0 and SAVE_EVERY <= start < STEPS and resumed["version"] == start
    at = learner.index(resumed)
    before = [e for e in learner[:at] if e["kind"] == "eval" and e["step"] == start]
    after = [e for e in learner[at:] if e["kind"] == "eval"]
    # The resumed learner's first evaluation is the checkpoint's adapted policy, not the base's.
    assert after[0]["step"] == start and after[0]["accuracy"] == before[0]["accuracy"]
    assert [e["step"] for e in learner[at:] if e["kind"] == "step"] == list(range(start + 1, STEPS + 1))


def test_the_checkpoint_holds_the_adapter_and_a_merged_export(lora_run):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ckpt = max((lora_run / "checkpoints").glob("step-*"))
    assert ckpt.name == f"step-{STEPS:06d}"
    # The learner state holds the adapters and their optimizer state only: the base is model.path.
    policy = base_policy(lora_run)
    base_bytes = sum(t.numel() * t.element_size() for _, t in named_weights(load_causal_lm(policy)))
    assert sum(f.stat().st_size for f in (ckpt / "learner").iterdir()) < base_bytes
    adapted = PeftModel.from_pretrained(load_causal_lm(policy), str(ckpt / "adapter")).eval()
    exported = AutoModelForCausalLM.from_pretrained(str(ckpt / "hf"), dtype=torch.float32).eval()
    seqs, starts = [[1, 5, 6, 14, 3, 4, 2]], [4]
    with torch.no_grad():
        want, _ = sequence_logprobs(adapted.base_model.model, seqs, starts, None, pad_id=0)
        got, _ = sequence_logprobs(exported, seqs, starts, None, pad_id=0)
        base, _ = sequence_logprobs(load_causal_lm(policy), seqs, starts, None, pad_id=0)
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, base, atol=1e-4)  # the adapter trained
