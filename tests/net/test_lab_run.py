"""The demo with every service on a host of its own (Redis, controller, teacher, learner, three replicas, and
the operator that launches, supervises and audits them), over links that are shaped, cut or flapped mid-run.

A fault scenario runs the demo for as long as it needs: a few steps, the fault for FAULT_S, the heal, then
steps again (the run resumes within a bound), then the run is stopped as Ctrl-C stops `up`. Its audit must be
intact: nothing lost, nothing trained twice, nothing beyond η, no one else moved the run."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import pytest

from asyncrl.core.records.controller import LeaseExpired, LeaseGranted, PushCommitted, ReplicaRegistered
from asyncrl.core.records.learner import Step, WeightsPushed
from asyncrl.core.runtime.events import read_records
from asyncrl.tools.lab_run import LabRun, replica_host, start_lab_run
from asyncrl.tools.netlab import Lab
from tests.run_helpers import REPO, steps_done, wait_for

DEMO = REPO / "examples" / "tiny-arith.yaml"
REPLICAS = 3
FAULT_S = 20.0
RESUMED_STEPS = 20
"""Steps the run makes after a heal before it is stopped."""
RESUME_BOUND_S = 120.0


def demo(steps: int, *overrides: str) -> tuple[str, ...]:
    return (f"rollout.replicas={REPLICAS}", f"learner.total_steps={steps}", "learner.eval_every=0", *overrides)


def intact(summary: dict) -> dict:
    audit = summary["audit"]
    assert audit["intact"], summary
    assert audit["lost"] == [] and audit["trained_twice"] == [] and audit["trained_beyond_eta"] == [], audit
    return audit


@pytest.fixture
def lab():
    with Lab() as lab:
        yield lab


def controller_records(run: LabRun, kind: type) -> list:
    return [ev for ev in read_records(run.run_dir, "controller") if isinstance(ev, kind)]


def test_every_service_on_its_own_host_trains_and_audits_clean(lab, tmp_path):
    steps = 10
    run = start_lab_run(lab, DEMO, tmp_path / "run", demo(steps))
    summary = run.wait(600)
    assert summary["exit_code"] == 0 and summary["audit"]["ok"], summary
    registered = {ev.replica_id: ev.address.rsplit(":", 1)[0] for ev in controller_records(run, ReplicaRegistered)}
    assert sorted(registered.values()) == sorted(lab.hosts[replica_host(i)].address for i in range(REPLICAS))
    last = controller_records(run, PushCommitted)[-1]
    assert (last.version, sorted(last.acked)) == (steps, sorted(registered))


def fault_scenario(lab: Lab, tmp_path, fault: Callable[[], None], heal: Callable[[], None],
                   after_heal: Callable[[LabRun, float], bool] = lambda run, healed: True,
                   overrides: tuple[str, ...] = ()) -> tuple[LabRun, dict]:
    """The demo (steps enough for any machine, with `overrides`) on its hosts: 5 steps, `fault()`, FAULT_S,
    `heal()`; then it must make RESUMED_STEPS more steps and `after_heal(run, heal time)` must hold within
    RESUME_BOUND_S; then it is stopped. Returns the run and its summary, audit intact."""
    run = start_lab_run(lab, DEMO, tmp_path / "run", demo(100_000, *overrides))
    try:
        wait_for(lambda: steps_done(run.run_dir) >= 5, 300, "5 steps", run_dir=run.run_dir)
        fault()
        time.sleep(FAULT_S)
        heal()
        healed, at_heal = time.time(), steps_done(run.run_dir)
        wait_for(lambda: steps_done(run.run_dir) >= at_heal + RESUMED_STEPS and after_heal(run, healed),
                 RESUME_BOUND_S, f"{RESUMED_STEPS} steps after the heal", run_dir=run.run_dir)
    finally:
        summary = run.stop()
    intact(summary)
    return run, summary


def test_a_replica_cut_from_the_learner_is_left_out_of_pushes_and_resyncs_after_the_heal(lab, tmp_path):
    """With sparse delta pushes of a bfloat16 wire: the cut replica misses versions, so its resync travels
    whole, and deltas go on to the whole group after it."""
    cut = replica_host(2)  # `up` gives replica i the id its host has

    def pushed_since(run, healed) -> list:
        return [ev for ev in read_records(run.run_dir, "learner")
                if isinstance(ev, WeightsPushed) and ev.t > healed and cut in ev.acked]

    def resynced_then_deltas(run, healed):
        pushes = pushed_since(run, healed)
        whole = max((ev.push_bytes for ev in pushes), default=0)
        return any(ev.push_bytes < whole for ev in pushes)

    run, _ = fault_scenario(lab, tmp_path, lambda: lab.cut("learner", cut), lambda: lab.heal("learner", cut),
                            after_heal=resynced_then_deltas,
                            overrides=("model.dtype=bfloat16", "learner.weight_transport.sparse_deltas=true"))
    # Cut between pushes, it does not join the next: called off after join_timeout_s, the others go on
    # without it. Cut mid-broadcast, the broadcast waits for it, at most weight_transport.timeout_s.
    steps = [ev.t for ev in read_records(run.run_dir, "learner") if isinstance(ev, Step)]
    assert max(b - a for a, b in itertools.pairwise(steps)) < run.config.learner.weight_transport.timeout_s + 10


def test_a_replica_cut_from_the_controller_loses_its_leases_and_gets_new_ones_after_the_heal(lab, tmp_path):
    cut = replica_host(1)

    def leased_again(run, healed):
        return any(ev.replica_id == cut and ev.t > healed for ev in controller_records(run, LeaseGranted))

    run, _ = fault_scenario(lab, tmp_path, lambda: lab.cut("controller", cut), lambda: lab.heal("controller", cut),
                            after_heal=leased_again)
    assert any(ev.replica_id == cut for ev in controller_records(run, LeaseExpired))  # its quota came back


@pytest.mark.parametrize(("a", "b", "how"), [
    ("learner", "redis", "drop"),              # the learner waits for data and says so
    ("learner", "controller", "drop"),         # the learner can neither push nor be challenged
    ("redis", replica_host(0), "drop"),        # its writes wait and are retried
    ("redis", replica_host(0), "reject"),      # ... refused at once instead
    (replica_host(0), "controller", "one_way"),  # it reaches the controller, the controller not it
], ids=lambda v: v)
def test_a_cut_mid_run_heals_and_the_run_resumes_intact(lab, tmp_path, a, b, how):
    run, _ = fault_scenario(lab, tmp_path, lambda: lab.cut(a, b, reject=how == "reject", one_way=how == "one_way"),
                            lambda: lab.heal(a, b))
    if (a, b) == ("learner", "controller"):  # it waited, and said so, naming the call
        learner_log = (run.run_dir / "logs" / "learner.log").read_text()
        assert "the controller's" in learner_log and "no answer for 5 s, still waiting" in learner_log


def test_a_flapping_link_heals_and_the_run_resumes_intact(lab, tmp_path):
    def flap():  # down and up every 2 s for FAULT_S, the fault's own time included
        for _ in range(int(FAULT_S / 4)):
            lab.link(replica_host(1), up=False)
            time.sleep(2)
            lab.link(replica_host(1))
            time.sleep(2)

    fault_scenario(lab, tmp_path, flap, lambda: None)
