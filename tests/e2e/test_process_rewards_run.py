"""`rollout.process_rewards` on the demo: the replicas score V(prefix) at each episode end with the weights they
hold (their version recorded), the groups carry the utilities to the learner, which trains on
them (the `process/*` figures of its steps), and the run completes with a clean audit. On the agent demo
(tests/e2e/test_agent_run.py, checked by `check_turn_scores`) the episodes are its turns: V scored after each
tool answer, the utility on the call that asked for it."""

from __future__ import annotations

import pytest

from asyncrl.core.records.learner import Step
from asyncrl.core.records.rollout import ProcessRewardsScored
from asyncrl.core.runtime.events import read_records
from tests.e2e.test_system import asyncrl_up, no_process_left
from tests.run_helpers import replica_records

pytestmark = pytest.mark.e2e

STEPS = 20


def test_replicas_score_process_rewards_and_the_learner_trains_on_them(tmp_path):
    run_dir = tmp_path / "run"
    # The demo's answers are a few digits: episodes of two tokens, the answer forced right after "=".
    summary = asyncrl_up(run_dir, f"learner.total_steps={STEPS}", "rollout.process_rewards.enabled=true",
                         "rollout.process_rewards.max_episode_tokens=2", 'rollout.process_rewards.force_answer="="',
                         timeout_s=600)
    assert summary["audit"]["ok"], summary["audit"]
    scored = [ev for ev in replica_records(run_dir) if isinstance(ev, ProcessRewardsScored)]
    assert scored and all(ev.episodes >= ev.responses > 0 and ev.seconds > 0 for ev in scored)
    # Scored beside the reward, by the weights the engine holds then: the generating version, or the one a push
    # brought meanwhile (recorded either way); they follow the run's versions.
    versions = [ev.version for ev in scored]
    assert min(versions) <= 1 and max(versions) >= STEPS - 3
    steps = [ev for ev in read_records(run_dir, "learner") if isinstance(ev, Step)]
    assert len(steps) == STEPS
    assert all(s.metrics["process/seq_frac"] > 0 and s.metrics["process/utility_abs_mean"] > 0 for s in steps)
    no_process_left(run_dir)


AGENT_TURN_SCORES = ("rollout.process_rewards.enabled=true", 'rollout.process_rewards.force_answer=""')
"""Process rewards on the agent demo: the observation's rendering opens the model's next turn, where it writes
the answer bare, so nothing is forced."""


def check_turn_scores(run_dir, steps: int) -> None:
    """An agent run with AGENT_TURN_SCORES: replicas scored turns, and every step trained on turn utilities."""
    scored = [ev for ev in replica_records(run_dir) if isinstance(ev, ProcessRewardsScored)]
    assert scored and sum(ev.episodes for ev in scored) > 0
    trained = [ev for ev in read_records(run_dir, "learner") if isinstance(ev, Step)]
    assert len(trained) == steps
    # The warm-started model calls the tool in most episodes: most sequences carry a turn utility, about one per
    # tool answer (two calls for three terms), never more than the turns answered (max_turns 4: 3 at most).
    assert all(s.metrics["process/seq_frac"] > 0.3 for s in trained)
    assert all(0.3 < s.metrics["process/episodes_per_seq"] <= 3.0 for s in trained)
