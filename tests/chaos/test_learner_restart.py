"""A learner restarted the way docker compose and Kubernetes restart it: the same config with a fixed rendezvous
store port (so the restarted process listens where the dead one did), a fresh process, the replicas left as
they were, holding weights newer than the checkpoint it resumes from.

Under compose this used to stall a run for good: the first push after the restart failed on the replicas (their
connection to the store still pointed at the dead process: a broken pipe), and their registrations and
heartbeats, carrying versions above the reset timeline, were refused once a second for as long as they lived.
`asyncrl up` restarts a learner on a fresh store port by default, which hid both."""

from __future__ import annotations

import pytest

from asyncrl.core.records.learner import Step
from asyncrl.core.runtime.events import read_events, read_records
from asyncrl.tools.audit import surviving
from asyncrl.tools.processes import free_port
from tests.chaos.test_kill import kill
from tests.run_helpers import demo_args, running_up, wait_for

pytestmark = pytest.mark.chaos

STEPS, SAVE_EVERY = 60, 20  # killed at step 25 or so: 15 steps before the next checkpoint could land


def surviving_steps(run_dir) -> int:
    return sum(isinstance(e, Step) for e in surviving(read_records(run_dir, "learner")))


def saved(run_dir, step: int) -> bool:
    return any(e["kind"] == "checkpoint_saved" and e["step"] == step for e in read_events(run_dir, "learner"))


def test_a_learner_restarted_on_its_own_port_behind_the_replicas_finishes_the_run(tmp_path):
    run_dir = tmp_path / "run"
    # A replica that misses one push of the new timeline sits out controller.push_backoff_s (10 s by default):
    # longer than the 40 steps after the restart take on a fast machine. One second here, so that a replica
    # missing a push for any passing reason still takes the later ones, and one refused for good fails the test.
    args = demo_args(run_dir, STEPS, "learner.eval_every=0", f"learner.checkpoint.save_every={SAVE_EVERY}",
                     f"learner.weight_transport.store_port={free_port()}", "controller.push_backoff_s=1")
    with running_up(*args) as proc:
        # Killed well past its checkpoint of step 20: the replicas hold version 25 or so, the checkpoint 20.
        wait_for(lambda: saved(run_dir, SAVE_EVERY) and surviving_steps(run_dir) >= SAVE_EVERY + 5, 300,
                 f"the checkpoint of step {SAVE_EVERY} and five steps more", run_dir=run_dir)
        kill(run_dir, "learner")
        wait_for(lambda: any(e["kind"] == "resumed" for e in read_events(run_dir, "learner")), 300, "the restart",
                 run_dir=run_dir)
        out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-5000:]
    assert "[up] audit OK" in out, out[-3000:]
    controller = read_events(run_dir, "controller")
    (reset,) = [e for e in controller if e["kind"] == "timeline_reset"]
    assert reset["version"] == SAVE_EVERY and reset["previous_version"] > SAVE_EVERY, reset
    steps = [e.step for e in surviving(read_records(run_dir, "learner")) if isinstance(e, Step)]
    assert steps == list(range(1, STEPS + 1))
    # Both replicas took pushes of the new timeline. Not asserted for every one: a replica slow to join (a loaded
    # CI machine) sits out pushes for controller.push_backoff_s like any replica that missed one. The race that
    # made them miss the new learner's first pushes in 1 run of 4 (a receiver waiting on the dead learner's
    # store, or its listener keeping a connection to it) is gone: no replica was held back in 10 runs.
    after = controller[controller.index(reset):]
    for replica in ("replica-0", "replica-1"):
        why = [e for e in after if replica in (e.get("replica_id"), *e.get("receivers", ()))
               and e["kind"] in ("replica_held_back", "replica_dropped", "push_begun", "replica_registered")]
        assert any(e["kind"] == "push_committed" and replica in e["acked"] for e in after), (replica, why[:12])
