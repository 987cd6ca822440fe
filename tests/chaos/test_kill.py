"""Kill -9 services of a running demo, one after another (the learner before its first checkpoint, the
teacher, the controller, redis-server, the learner again, a replica): `asyncrl up` restarts each (the
controller from its state in Redis, Redis on its append-only file, the learner alone from its latest
checkpoint or the base model, taking the run back there), the run
completes all its steps and the audit finds
nothing lost and nothing trained twice against the surviving policy; held-out accuracy after the learner's
restart is the checkpoint's, not the base policy's (the same greedy evaluation of the same weights)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from asyncrl.core.records.learner import Eval, Step
from asyncrl.core.runtime.events import read_events, read_records
from asyncrl.tools.audit import surviving
from tests.run_helpers import demo_args, running_up, steps_done, wait_for

pytestmark = pytest.mark.chaos

STEPS, SAVE_EVERY = 80, 20


def kill(run_dir: Path, role: str) -> None:
    marker = f"{role} --config {run_dir / 'config.resolved.yaml'}"
    pids = subprocess.run(["pgrep", "-f", marker], check=False, capture_output=True, text=True).stdout.split()
    assert pids, f"no {role} process to kill"
    os.kill(int(pids[0]), signal.SIGKILL)


def kill_redis(run_dir: Path) -> None:
    # redis-server retitles itself "redis-server host:port": find it by the port in the run's config.
    url = yaml.safe_load((run_dir / "config.resolved.yaml").read_text())["buffer"]["redis_url"]
    host_port = url.split("//", 1)[1].split("/", 1)[0]
    pids = subprocess.run(["pgrep", "-f", f"redis-server {host_port}"], check=False, capture_output=True,
                          text=True).stdout.split()
    assert pids, "no redis-server to kill"
    os.kill(int(pids[0]), signal.SIGKILL)


def surviving_steps(run_dir: Path) -> int:
    return sum(isinstance(e, Step) for e in surviving(read_records(run_dir, "learner")))


def checkpoint_of_step(run_dir: Path, step: int) -> bool:
    """Whether the learner process running now saved its checkpoint of `step`."""
    learner = read_events(run_dir, "learner")
    last_start = max((i for i, e in enumerate(learner) if e["kind"] == "resumed"), default=-1)
    return any(e["kind"] == "checkpoint_saved" and e["step"] == step for e in learner[last_start + 1 :])


def test_killed_services_are_restarted_and_the_run_completes(tmp_path):
    run_dir = tmp_path / "run"
    args = demo_args(run_dir, STEPS, f"learner.eval_every={SAVE_EVERY}", f"learner.checkpoint.save_every={SAVE_EVERY}")
    with running_up(*args) as proc:
        wait_for(lambda: steps_done(run_dir) >= 6, 300, "6 learner steps", run_dir=run_dir)
        kill(run_dir, "learner")  # no checkpoint yet: it comes back from the base model, the run back to version 0
        wait_for(lambda: any(e["kind"] == "resumed" for e in read_events(run_dir, "learner")), 300, "the restart",
                 run_dir=run_dir)
        # Counted on the surviving timeline: the learner may train a few more steps before the kill lands.
        wait_for(lambda: surviving_steps(run_dir) >= 12, 300, "12 steps on the surviving timeline", run_dir=run_dir)
        kill(run_dir, "teacher")
        wait_for(lambda: surviving_steps(run_dir) >= 16, 300, "16 steps on the surviving timeline", run_dir=run_dir)
        kill(run_dir, "controller")
        wait_for(lambda: surviving_steps(run_dir) >= 20, 300, "20 steps on the surviving timeline", run_dir=run_dir)
        kill_redis(run_dir)
        wait_for(lambda: surviving_steps(run_dir) >= 30 and checkpoint_of_step(run_dir, SAVE_EVERY), 300,
                 "30 steps on the surviving timeline and the checkpoint of step 20", run_dir=run_dir)
        kill(run_dir, "learner")  # its checkpoint is step 20: ten steps or more are lost and trained again
        wait_for(lambda: sum(e["kind"] == "resumed" for e in read_events(run_dir, "learner")) == 2, 300,
                 "the second restart", run_dir=run_dir)
        wait_for(lambda: surviving_steps(run_dir) >= 45, 300, "45 steps on the surviving timeline", run_dir=run_dir)
        kill(run_dir, "rollout")
        out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-5000:]
    assert "[up] audit OK" in out, out[-3000:]
    for restart in ("restarting it from the base model", "restarting it from its checkpoint", "teacher exited",
                    "controller exited", "redis-server exited", "rollout-0 exited"):
        assert restart in out, (restart, out[-3000:])
    # The controller killed mid-run continued from its saved state; the learner restarted alone took the run
    # back to its checkpoint (version 20) with a timeline reset. Pushes run in the background, so when the
    # learner has written step k the controller has committed k - 1 at least (the push of k may be in flight):
    # the controller was killed after 12 steps of the surviving timeline, the learner first after its 6th step.
    controller = read_events(run_dir, "controller")
    starts = [e for e in controller if e["kind"] == "controller_started"]
    assert len(starts) == 2 and starts[0]["restored"] is None, starts
    assert starts[1]["restored"]["version"] >= 11 and starts[1]["restored"]["replicas"] == 2, starts[1]
    first, second = [e for e in controller if e["kind"] == "timeline_reset"]
    assert first["version"] == 0 and first["previous_version"] >= 5, first
    assert second["version"] == SAVE_EVERY and second["previous_version"] > SAVE_EVERY, second
    learner = read_events(run_dir, "learner")
    assert [e["from_step"] for e in learner if e["kind"] == "resumed"] == [0, SAVE_EVERY]
    timeline = surviving(read_records(run_dir, "learner"))
    assert [e.step for e in timeline if isinstance(e, Step)] == list(range(1, STEPS + 1))
    # Accuracy after the restart continues from the checkpoint (the same greedy evaluation of the same weights).
    evals = [e for e in learner if e["kind"] == "eval"]
    at_checkpoint = [e for e in evals if e["step"] == SAVE_EVERY]
    assert at_checkpoint[0]["accuracy"] == at_checkpoint[-1]["accuracy"], at_checkpoint
    final = [e for e in timeline if isinstance(e, Eval)][-1].accuracy
    audit = next(line for line in out.splitlines() if "[up] audit" in line)
    print(f"accuracy {evals[0]['accuracy']:.3f} -> checkpoint {at_checkpoint[0]['accuracy']:.3f} -> final "
          f"{final:.3f}; {audit}")
