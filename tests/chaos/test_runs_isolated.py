"""Several LoRA runs on one base, some of them failing (examples/multi-lora.yaml cut to three runs): the `hangs` run's
reward never returns on the replicas, so on every replica its rollout loop dies of `RewardWorkersHung` again and
again before a group is written; the `flaky` run's reward hangs once in the learner's held-out evaluation, so its
learner loop dies once; the `steady` run's controller is killed with SIGKILL once. Each failure stays in its run:
no replica or learner process exits (the failed run's replica restarts inside them, flaky's loop inside the
learner), `up` restarts steady's controller, and steady and flaky train to their last steps with a clean audit
each. Removing `hangs` then ends the deployment; its audit finds it trained nothing, and nothing lost, twice or
beyond η."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from asyncrl.core.runtime.events import read_events
from tests.e2e.test_system import REPO
from tests.run_helpers import running_up, steps_done, wait_for

pytestmark = pytest.mark.chaos

STEPS, KILL_AFTER, FLAKY_STEPS = 60, 10, 20

HANGS_ON_THE_REPLICAS = '''
import sys
import threading

from asyncrl.core.tasks.arith import arith_exact


def score(response, metadata):
    if "rollout" in sys.argv:  # every call on a replica: its first group exhausts the workers, none is written
        threading.Event().wait()  # never returns
    return arith_exact(response, metadata)
'''
"""Not only on some responses: groups without one would be written, a first batch could fill, and hangs' learner
would score its first evaluation with the same reward (its loop then fails in the learner as well)."""

HANGS_ONCE_IN_THE_LEARNER = '''
import sys
import time
from pathlib import Path

from asyncrl.core.tasks.arith import arith_exact

ONCE = Path(__file__).with_suffix(".once")


def score(response, metadata):
    if "learner" in sys.argv and ONCE.exists():  # the learner's held-out evaluation, the first call only
        ONCE.unlink(missing_ok=True)
        time.sleep(30)  # past reward.timeout_s, holding the one reward worker
    return arith_exact(response, metadata)
'''


def restarted_on_a_hang(run_dir) -> bool:
    """A replica process restarted hangs' replica inside it after its rollout loop died of the hung reward."""
    logs = [path.read_text() for path in (run_dir / "logs").glob("rollout-*.log")]
    return any("run hangs: its replica's rollout loop died: RewardWorkersHung" in log and "restarting it (1/3)" in log
               for log in logs)


def test_a_failing_run_never_stops_or_slows_the_other(tmp_path):
    reward = tmp_path / "my_reward.py"
    reward.write_text(HANGS_ON_THE_REPLICAS)
    run_dir = tmp_path / "run"
    hangs = {"reward": {"type": "function", "function": f"{reward}:score", "workers": 2, "timeout_s": 1}}
    once = tmp_path / "hangs_once.py"
    once.write_text(HANGS_ONCE_IN_THE_LEARNER)
    once.with_suffix(".once").touch()
    flaky = {"reward": {"type": "function", "function": f"{once}:score", "workers": 1, "timeout_s": 1},
             "learner": {"total_steps": FLAKY_STEPS}}
    runs = json.dumps([{"name": "steady"}, {"name": "hangs", "overrides": hangs},
                       {"name": "flaky", "overrides": flaky}])
    args = ["--config", str(REPO / "examples" / "multi-lora.yaml"), "--set", f"run_dir={run_dir}",
            "--set", f"learner.total_steps={STEPS}", "--set", "learner.eval_every=0", "--set", f"runs={runs}"]
    with running_up(*args) as proc:
        steady = run_dir / "steady"
        wait_for(lambda: steps_done(steady) >= KILL_AFTER, 300, f"{KILL_AFTER} steps of steady", run_dir=run_dir)
        marker = f"controller --config {run_dir / 'config.resolved.yaml'} --run steady"
        [pid] = subprocess.run(["pgrep", "-f", marker], check=False, capture_output=True, text=True).stdout.split()
        os.kill(int(pid), signal.SIGKILL)
        wait_for(lambda: steps_done(steady) >= STEPS, 300, "steady's last step", run_dir=run_dir)
        # Hangs' first group fails after its reward's time-outs, about as long as steady's 60 steps take: its
        # removal waits for that restart, or a slower machine would remove it before it ever failed.
        wait_for(lambda: restarted_on_a_hang(run_dir), 120, "a restart of hangs' replica", run_dir=run_dir)
        subprocess.run([sys.executable, "-m", "asyncrl", "runs", "remove", str(run_dir), "hangs"], cwd=REPO,
                       check=True, timeout=60)
        output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output[-4000:]
    assert "controller-steady exited with -9; restarting it" in output
    assert "rollout-0 exited" not in output and "rollout-1 exited" not in output  # no replica process died
    assert "learner exited" not in output  # flaky's loop was restarted inside it
    learner_log = (run_dir / "logs" / "learner.log").read_text()
    assert "RewardWorkersHung" in learner_log
    assert "run flaky: its loop failed; restarting it from its latest checkpoint (1/2)" in learner_log
    assert "(2/2)" not in learner_log
    assert "[up] run steady: audit OK" in output and "[up] run flaky: audit OK" in output, output[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())["runs"]
    assert summary["steady"]["last_step"] == STEPS and summary["flaky"]["last_step"] == FLAKY_STEPS
    flaky_events = read_events(run_dir / "flaky", "learner")
    assert [e["kind"] for e in flaky_events].count("learner_started") == 2  # the loop began twice
    assert [e["step"] for e in flaky_events if e["kind"] == "step"] == list(range(1, FLAKY_STEPS + 1))
    hangs = summary["hangs"]["audit"]  # it trained nothing (its rewards hang), and lost or broke nothing either
    assert hangs["failures"] == ["no group was trained", f"the run ended at step 0 of {STEPS}"]
    assert [e["step"] for e in read_events(steady, "learner") if e["kind"] == "step"] == list(range(1, STEPS + 1))
