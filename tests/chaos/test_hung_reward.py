"""A user reward function that never returns on some responses (a regex that backtracks forever, a solver in
a loop) used to hold the replica's reward threads for good: every later sample waited out `reward.timeout_s`
and scored 0, and the run trained on zeros. Now, once every reward worker is held by such a call, the
replica's rollout loop dies of `RewardWorkersHung` and the replica exits (code 1) naming the cause, so its
supervisor restarts it with fresh threads; here, with no restarts allowed, `up` ends the run and shows why."""

from __future__ import annotations

import pytest

from tests.run_helpers import demo_args, running_up

pytestmark = pytest.mark.chaos

HANGS_ON_A_SEVEN = '''
import threading

from asyncrl.core.tasks.arith import arith_exact


def score(response, metadata):
    if "7" in response:
        threading.Event().wait()  # never returns
    return arith_exact(response, metadata)
'''


def test_a_reward_that_hangs_ends_the_replica_loudly_not_the_run_silently(tmp_path):
    reward_file = tmp_path / "my_reward.py"
    reward_file.write_text(HANGS_ON_A_SEVEN)
    args = demo_args(tmp_path / "run", 300, "learner.eval_every=0", "reward.type=function",
                     f"reward.function={reward_file}:score", "reward.workers=2", "reward.timeout_s=1",
                     "rollout.max_restarts=0")  # fmt: skip
    with running_up(*args) as proc:
        output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 1, output
    assert "exited with 1" in output and "RewardWorkersHung: all 2 reward workers (reward.workers)" in output, output
