"""The whole system on one CUDA GPU, as a user runs it: `asyncrl up` with the learner, the replicas' torch
engines and the teacher on the GPU, weights pushed over gloo (NCCL needs one GPU per rank: two ranks on one
device are refused, so a one-GPU machine pushes over gloo; the CUDA learner's buckets are copied to the host
per bucket). The dense demo (decoupled PPO, OPD from the teacher) and the MoE demo with R3 routing replay
(experts captured by the CUDA engines, replayed in the CUDA learner's forwards) both learn, and their audits are
clean. The CPU tier runs the same configurations on CPUs (tests/e2e/test_system.py,
tests/e2e/test_moe_routing_replay.py).

Skipped without CUDA.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch

from asyncrl.core.runtime.events import read_events
from tests.e2e.test_system import asyncrl_up, check_run

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

REPO = Path(__file__).resolve().parents[2]
ON_GPU = ["learner.device=cuda", "rollout.engine.device=cuda", "teacher.engine.device=cuda"]


def test_demo_on_one_gpu_learns_and_audits_clean(tmp_path):
    run_dir = tmp_path / "run"
    steps = 100
    summary = asyncrl_up(run_dir, f"learner.total_steps={steps}", "learner.eval_every=50", *ON_GPU, timeout_s=900)
    check_run(run_dir, summary, steps=steps, replicas=2)
    assert summary["eval_last"] > summary["eval_first"], summary
    pushes = [e for e in read_events(run_dir, "learner") if e["kind"] == "push"]
    print(f"gpu demo: accuracy {summary['eval_first']} -> {summary['eval_last']}, "
          f"push median {statistics.median(e['push_s'] for e in pushes) * 1000:.1f} ms")


def test_moe_r3_on_one_gpu_replays_the_rollout_routing(tmp_path):
    run_dir = tmp_path / "run"
    steps = 60
    summary = asyncrl_up(run_dir, f"learner.total_steps={steps}", "learner.eval_every=30",
                         "learner.routing_replay.mode=r3", "learner.routing_replay.measure_unreplayed=true",
                         "learner.device=cuda", "rollout.engine.device=cuda",
                         config=REPO / "examples" / "tiny-moe.yaml", timeout_s=900)
    assert summary["audit"]["ok"], summary["audit"]
    steps_ev = [e for e in read_events(run_dir, "learner") if e["kind"] == "step"]
    assert len(steps_ev) == steps
    assert all(e["routing/bytes_per_token"] == 4.0 for e in steps_ev)
    changed = [e for e in steps_ev if e["rc/delta_abs_mean"] != e["routing/delta_abs_unreplayed"]]
    replayed = statistics.fmean(e["rc/delta_abs_mean"] for e in steps_ev)
    unreplayed = statistics.fmean(e["routing/delta_abs_unreplayed"] for e in steps_ev)
    print(f"gpu moe r3: mismatch {statistics.fmean(e['routing/mismatch_frac'] for e in steps_ev):.4f}, "
          f"|delta| replayed {replayed:.2e} vs unreplayed {unreplayed:.2e}, "
          f"accuracy {summary['eval_first']} -> {summary['eval_last']}")
    assert statistics.fmean(e["routing/mismatch_frac"] for e in steps_ev) > 0
    assert len(changed) >= steps // 2
    assert summary["eval_last"] > summary["eval_first"], summary
