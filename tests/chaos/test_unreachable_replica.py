"""A replica that registers an address nothing answers at (a wrong `rollout.advertise_host`, the commonest
deployment mistake) joins the demo as it starts. Before, every push picked it, waited for it, failed, and
after three attempts the learner died (twice, and the run with it). Now it joins no push at all: the
controller never reaches it at its address, so it sits out pushes for `controller.push_backoff_s` (doubling)
and is told why, no push is aborted for it, the healthy replicas keep training, and the run completes with a
clean audit and no learner restart."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from asyncrl.core.runtime.events import read_events
from tests.run_helpers import REPO, demo_args, running_up, wait_for

pytestmark = pytest.mark.chaos

STEPS = 300


def test_a_replica_nobody_can_reach_does_not_stop_the_run(tmp_path):
    run_dir = tmp_path / "run"
    args = demo_args(run_dir, STEPS, "learner.eval_every=0", "controller.push_backoff_s=2",
                     "learner.weight_transport.join_timeout_s=1")
    with running_up(*args) as proc:
        # Started with the run, not after some steps: its start-up (torch, the model) took longer than the
        # demo's 300 steps on a loaded machine, and the run ended before the controller had held it back.
        wait_for(lambda: (run_dir / "config.resolved.yaml").exists() and (run_dir / "redis-password").exists(),
                 300, "the run's config and Redis")
        # It binds loopback (127.0.0.1) but tells the controller 127.0.0.2: UpdateWeights finds nobody there.
        env = {**os.environ, "ASYNCRL_REDIS_PASSWORD": (run_dir / "redis-password").read_text().strip()}
        stray_log = (tmp_path / "stray.log").open("w")
        stray = subprocess.Popen(
            [sys.executable, "-m", "asyncrl.tools.cli", "rollout", "--config", str(run_dir / "config.resolved.yaml"),
             "--replica-id", "replica-stray", "--set", "rollout.advertise_host=127.0.0.2"],
            cwd=REPO, env=env, stdout=stray_log, stderr=subprocess.STDOUT)
        try:
            held = lambda: [e for e in read_events(run_dir, "controller") if e["kind"] == "replica_held_back"]
            wait_for(lambda: len(held()) >= 2 or proc.poll() is not None, 300, "the stray replica held back twice")
            assert proc.poll() is None, "the run ended before the stray replica was held back twice"
            out, _ = proc.communicate(timeout=600)
        finally:
            stray.kill()
            stray.wait()
            stray_log.close()
    assert proc.returncode == 0, out[-5000:]
    assert "[up] audit OK" in out and "learner exited" not in out, out[-3000:]
    assert {e["replica_id"] for e in held()} == {"replica-stray"}, held()
    assert [e["seconds"] for e in held()][:2] == [2.0, 4.0]
    events = read_events(run_dir, "controller")
    assert not [e for e in events if e["kind"] == "push_aborted"]
    assert "replica-stray" not in {rid for e in events if e["kind"] == "push_begun" for rid in e["receivers"]}
    # The stray replica's own log says why it gets nothing to do.
    assert "out of weight pushes" in (tmp_path / "stray.log").read_text()
    steps = [e["step"] for e in read_events(run_dir, "learner") if e["kind"] == "step"]
    assert steps == list(range(1, STEPS + 1))
