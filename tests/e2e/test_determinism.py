"""`model.determinism` end to end, as a user runs it (`asyncrl up`, two torch-engine replicas, η = 0).

bitwise: every step's logp_prox equals the engines' logp_behav bit for bit (the largest |δ| and both mismatch KL
estimates exactly 0.0), dense and MoE (whose routing then matches the engines' without replay), float32 and
float16.
reproducible: two runs of the same config end with the same weights, tensor for tensor, although which
replica played which prompt, and what it was batched with, differed between them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from asyncrl.core.runtime.events import read_events
from tests.e2e.test_system import REPO, asyncrl_up, no_process_left

pytestmark = pytest.mark.e2e

STEPS = 10


def _steps(run_dir: Path) -> list[dict]:
    return [ev for ev in read_events(run_dir, "learner") if ev["kind"] == "step"]


@pytest.mark.parametrize("config, dtype", [("tiny-arith.yaml", "float32"),
                                           pytest.param("tiny-moe.yaml", "float32",
                                                        marks=pytest.mark.example_model("tiny-moe")),
                                           ("tiny-arith.yaml", "float16")])
def test_bitwise_at_eta_0_trains_exactly_on_policy(tmp_path, config, dtype):
    """float16: engines in float16, the learner's float32 master weights rounded for every forward and every
    push (which travels in float16: half the float32 bytes)."""
    run_dir = tmp_path / "run"
    summary = asyncrl_up(run_dir, "model.determinism=bitwise", "controller.eta=0", f"learner.total_steps={STEPS}",
                         "learner.eval_every=0", f"model.dtype={dtype}", timeout_s=600,
                         config=REPO / "examples" / config)
    assert summary["audit"]["ok"]
    steps = _steps(run_dir)
    assert len(steps) == STEPS
    for ev in steps:
        assert ev["staleness/max"] == 0
        assert (ev["rc/delta_abs_max"], ev["rc/kl_k1"], ev["rc/kl_k3"]) == (0.0, 0.0, 0.0), ev["version"]
        if "routing/mismatch_frac" in ev:
            assert ev["routing/mismatch_frac"] == 0.0
    pushes = [ev for ev in read_events(run_dir, "learner") if ev["kind"] == "push"]
    if dtype == "float16":
        weights = load_file(run_dir / "checkpoints" / f"step-{STEPS:06d}" / "hf" / "model.safetensors")
        assert {t.dtype for t in weights.values()} == {torch.float32}  # the masters
        assert pushes[-1]["push_bytes"] == sum(t.numel() * 2 for t in weights.values())
    no_process_left(run_dir)


def test_two_reproducible_runs_end_with_the_same_weights(tmp_path):
    weights = []
    placements = []
    for name in ("first", "second"):
        run_dir = tmp_path / name
        asyncrl_up(run_dir, "model.determinism=reproducible", "controller.eta=0", f"learner.total_steps={STEPS}",
                   "learner.eval_every=0", timeout_s=600)
        weights.append(load_file(run_dir / "checkpoints" / f"step-{STEPS:06d}" / "hf" / "model.safetensors"))
        placements.append({ev["prompt_index"]: log.stem for log in (run_dir / "events").glob("rollout-*.jsonl")
                           for ev in read_events(run_dir, log.stem) if ev["kind"] == "group_written"})
    first, second = weights
    assert first.keys() == second.keys()
    assert [name for name in first if not torch.equal(first[name], second[name])] == []
    # Both replicas played in both runs (what each one played is up to timing; the weights do not care).
    assert all(len(set(placed.values())) == 2 for placed in placements)
