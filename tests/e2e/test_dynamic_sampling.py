"""`sampling.drop_uniform_groups` (DAPO's dynamic sampling) on the demo: replicas write only groups whose rewards
differ, skip the rest with a record, the controller admits replacements for their quota, and the run completes
with a clean audit (η held at admission and at training, every written group trained once)."""

from __future__ import annotations

import pytest

from asyncrl.core.records.controller import LeaseCompleted
from asyncrl.core.records.learner import Trained
from asyncrl.core.records.rollout import GroupSkipped, GroupWritten
from asyncrl.core.runtime.events import read_records
from tests.e2e.test_system import asyncrl_up, no_process_left
from tests.run_helpers import replica_records

pytestmark = pytest.mark.e2e

STEPS = 30


def test_groups_with_uniform_rewards_never_reach_the_learner_and_their_quota_comes_back(tmp_path):
    run_dir = tmp_path / "run"
    # The demo distils from its teacher (OPD): a per-token signal even in a uniform group, so it is off here.
    summary = asyncrl_up(run_dir, f"learner.total_steps={STEPS}", "sampling.drop_uniform_groups=true",
                         "learner.algo.opd.enabled=false", "teacher.enabled=false",
                         timeout_s=600)
    assert summary["audit"]["ok"], summary["audit"]
    rollout = replica_records(run_dir)
    written = {ev.group_id: ev for ev in rollout if isinstance(ev, GroupWritten)}
    skipped = [ev for ev in rollout if isinstance(ev, GroupSkipped)]
    assert skipped, "the demo's policy solves no or every sample of some prompts: some groups must be skipped"
    assert summary["audit"]["skipped_uniform"] == len(skipped)
    # 0/1 rewards: a written group has some right and some wrong; a skipped one all the same.
    assert all(0.0 < ev.reward_mean < 1.0 for ev in written.values())
    assert {ev.reward for ev in skipped} <= {0.0, 1.0}
    trained = {g for ev in read_records(run_dir, "learner") if isinstance(ev, Trained) for g in ev.group_ids}
    assert trained <= set(written) and not trained & {ev.group_id for ev in skipped}
    # Each skipped group's lease completed with nothing written: its quota went back for another prompt.
    completed = {ev.lease_id: ev.num_written for ev in read_records(run_dir, "controller")
                 if isinstance(ev, LeaseCompleted)}
    assert all(completed[ev.lease_id] == 0 for ev in skipped if ev.lease_id in completed)
    assert sum(ev.lease_id in completed for ev in skipped) >= len(skipped) - 16  # the last batches may be cut off
    no_process_left(run_dir)
