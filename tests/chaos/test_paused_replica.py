"""A replica that hangs without dying (SIGSTOP: a process swapped out, a stalled accelerator, a debugger) in a
running demo, then resumes. It neither answers nor heartbeats meanwhile, so the push that picked it stalls
until the learner calls it off or the controller declares it dead; the run goes on without it. Before, that
push could wait out the push's whole time-out (120 s), and once the replica resumed it worked through the
UpdateWeights calls that had queued up for pushes long over, each waiting up to 60 s for a verdict that would
never come, so it missed every push after them and was held back again and again. Now the stall is bounded
by the pause, and the resumed replica takes the next push. The run is stopped (Ctrl-C) once it has, and its
audit must find nothing wrong but that it ended early."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import time

import pytest

from asyncrl.core.runtime.events import read_events
from tests.run_helpers import demo_args, running_up, steps_done, wait_for

pytestmark = pytest.mark.chaos

STEPS, PAUSE_S = 700, 15.0
"""STEPS: more than the run reaches before the test stops it (about 390 here)."""


def pushes_acked_by(run_dir, replica_id: str, after: float) -> list[float]:
    """When each push that `replica_id` acknowledged after `after` was committed."""
    return [e["t"] for e in read_events(run_dir, "controller")
            if e["kind"] == "push_committed" and replica_id in e["acked"] and e["t"] > after]


def test_a_paused_replica_stalls_the_run_at_most_for_its_pause_and_rejoins(tmp_path):
    run_dir = tmp_path / "run"
    args = demo_args(run_dir, STEPS, "learner.eval_every=0", "learner.weight_transport.join_timeout_s=1")
    with running_up(*args) as proc:
        wait_for(lambda: steps_done(run_dir) >= 100, 300, "100 learner steps")
        marker = f"rollout --config {run_dir / 'config.resolved.yaml'} --replica-id replica-0"
        [pid] = subprocess.run(["pgrep", "-f", marker], check=True, capture_output=True, text=True).stdout.split()
        os.kill(int(pid), signal.SIGSTOP)
        try:
            time.sleep(PAUSE_S)
        finally:
            os.kill(int(pid), signal.SIGCONT)
        resumed = time.time()
        # Back in the fleet within seconds of resuming: a push it acknowledged. Then the run has shown it all.
        wait_for(lambda: pushes_acked_by(run_dir, "replica-0", resumed), 60, "a push replica-0 acknowledged",
                 run_dir=run_dir)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "[up] interrupted; stopping" in out, out[-5000:]
    assert "learner exited" not in out and "rollout-0 exited" not in out, out[-3000:]
    audit = json.loads((run_dir / "summary.json").read_text())["audit"]
    assert audit["intact"] and audit["lost"] == [] and audit["trained_twice"] == [], audit
    assert audit["failures"] == [f"the run ended at step {audit['last_step']} of {STEPS}"], audit
    controller = read_events(run_dir, "controller")
    assert any(e["kind"] == "replica_dead" and e["replica_id"] == "replica-0" for e in controller)
    assert pushes_acked_by(run_dir, "replica-0", resumed)[0] < resumed + 10, "the resumed replica took no push in 10 s"
    # The learner stalled at most about as long as the pause (not the push's time-outs: 60 s, 120 s).
    steps = [e["t"] for e in read_events(run_dir, "learner") if e["kind"] == "step"]
    assert len(steps) == audit["last_step"] and max(b - a for a, b in itertools.pairwise(steps)) < PAUSE_S + 3
