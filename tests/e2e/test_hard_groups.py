"""`controller.difficulty.hard_group_size` on the demo: hard prompts sampled again get groups of 16 where the
stream's get 8 (G), within the same budget of B = 64 trajectories per learner step. The controller grants a
larger group only within one step's share of N_r, the replicas write it as one group, the learner makes every
batch of exactly B trajectories from groups of both sizes, and the run completes with a clean audit (η held at
admission and at training, every written group trained once). The agent demo's run
(tests/e2e/test_agent_run.py) is checked the same way, a replica playing a hard prompt's 16 episodes side by
side."""

from __future__ import annotations

import pytest

from asyncrl.core.records.controller import LeaseGranted
from asyncrl.core.records.learner import Trained
from asyncrl.core.records.rollout import GroupWritten
from asyncrl.core.runtime.events import read_records
from tests.e2e.test_system import DEMO_CONFIG, asyncrl_up, no_process_left
from tests.run_helpers import replica_records

pytestmark = pytest.mark.e2e

B, G, HARD = 64, 8, 16


HARD_GROUPS = ("controller.difficulty.replay_share=0.5", f"controller.difficulty.hard_group_size={HARD}")
"""The overrides that sample the prompts a run fails again, in groups of HARD."""


def test_hard_prompts_get_larger_groups_within_each_steps_budget(tmp_path):
    run_dir = tmp_path / "run"
    steps = 30
    summary = asyncrl_up(run_dir, f"learner.total_steps={steps}", "learner.eval_every=0", *HARD_GROUPS,
                         timeout_s=900, config=DEMO_CONFIG)
    assert summary["audit"]["ok"], summary["audit"]
    check_hard_groups(run_dir, steps)
    no_process_left(run_dir)


def check_hard_groups(run_dir, steps: int) -> None:
    """A run with HARD_GROUPS: hard prompts got groups of HARD within one step's share, every step trained
    exactly B trajectories, some from groups of both sizes."""
    grants = [ev for ev in read_records(run_dir, "controller") if isinstance(ev, LeaseGranted)]
    hard = [ev for ev in grants if ev.n == HARD]
    assert hard, "the demo has prompts it fails from the start: some must be sampled again"
    assert all(ev.n in (G, HARD) for ev in grants)
    assert all(ev.sample_index is not None and not ev.regenerated for ev in hard)
    for ev in hard:  # never across two steps' shares of N_r
        assert (ev.admitted_after - ev.n) // B == (ev.admitted_after - 1) // B, ev
    written = {ev.group_id: ev for ev in replica_records(run_dir) if isinstance(ev, GroupWritten)}
    assert {ev.trajectories for ev in written.values()} == {G, HARD}
    hard_leases = {ev.lease_id for ev in hard}
    assert all((ev.trajectories == HARD) == (ev.lease_id in hard_leases) for ev in written.values())
    trained = [ev for ev in read_records(run_dir, "learner") if isinstance(ev, Trained)]
    assert [ev.step for ev in trained] == list(range(steps))
    assert all(ev.trajectories == B for ev in trained)  # every step: the same budget, groups of both sizes
    mixed = [ev for ev in trained if {written[g].trajectories for g in ev.group_ids} == {G, HARD}]
    assert mixed, "some batch must hold groups of both sizes"
