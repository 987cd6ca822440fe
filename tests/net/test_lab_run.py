"""The demo with every service on a host of its own (Redis, controller, teacher, learner, three replicas, and
the operator that launches, supervises and audits them), over links that are shaped or cut mid-run. Each run
is judged by its audit: nothing lost, nothing trained twice, nothing beyond η."""

from __future__ import annotations

import time

import pytest

from asyncrl.core.records.controller import PushCommitted, ReplicaRegistered
from asyncrl.core.runtime.events import read_records
from asyncrl.tools.lab_run import replica_host, start_lab_run
from asyncrl.tools.netlab import Lab
from tests.run_helpers import REPO, steps_done, wait_for

DEMO = REPO / "examples" / "tiny-arith.yaml"
REPLICAS = 3


def demo(steps: int, *overrides: str) -> tuple[str, ...]:
    return (f"rollout.replicas={REPLICAS}", f"learner.total_steps={steps}", "learner.eval_every=0", *overrides)


def clean(summary: dict) -> dict:
    audit = summary["audit"]
    assert summary["exit_code"] == 0 and audit["ok"], summary
    assert audit["lost"] == [] and audit["trained_twice"] == [] and audit["trained_beyond_eta"] == [], audit
    return audit


@pytest.fixture
def lab():
    with Lab() as lab:
        yield lab


def test_every_service_on_its_own_host_trains_and_audits_clean(lab, tmp_path):
    steps = 10
    run = start_lab_run(lab, DEMO, tmp_path / "run", demo(steps))
    clean(run.wait(600))
    controller = read_records(run.run_dir, "controller")
    registered = {ev.replica_id: ev.address.rsplit(":", 1)[0] for ev in controller if isinstance(ev, ReplicaRegistered)}
    assert sorted(registered.values()) == sorted(lab.hosts[replica_host(i)].address for i in range(REPLICAS))
    last = [ev for ev in controller if isinstance(ev, PushCommitted)][-1]
    assert (last.version, sorted(last.acked)) == (steps, sorted(registered))


def test_a_replica_cut_from_the_learner_is_left_out_of_pushes_and_resyncs_after_the_heal(lab, tmp_path):
    steps, cut_at, heal_at = 16, 3, 8
    run = start_lab_run(lab, DEMO, tmp_path / "run", demo(steps))
    wait_for(lambda: steps_done(run.run_dir) >= cut_at, 300, f"{cut_at} steps", run_dir=run.run_dir)
    lab.cut("learner", replica_host(2))
    wait_for(lambda: steps_done(run.run_dir) >= heal_at, 300, f"{heal_at} steps", run_dir=run.run_dir)
    lab.heal("learner", replica_host(2))
    clean(run.wait(600))
    pushes = [ev for ev in read_records(run.run_dir, "controller") if isinstance(ev, PushCommitted)]
    cut = replica_host(2)  # `up` gives replica i the id its host has
    assert any(ev.mode == "new" and cut not in ev.acked for ev in pushes)  # the others went on without it
    assert cut in pushes[-1].acked and pushes[-1].version == steps  # back on the current weights


@pytest.mark.parametrize(("a", "b", "how"), [
    ("controller", replica_host(1), "drop"),   # its leases expire, their quota returns
    ("learner", "redis", "drop"),              # the learner waits for data and says so
    ("learner", "controller", "drop"),         # the learner can neither push nor be challenged
    ("redis", replica_host(0), "drop"),        # its writes wait and are retried
    ("redis", replica_host(0), "reject"),      # ... refused at once instead
    (replica_host(0), "controller", "one_way"),  # it reaches the controller, the controller not it
], ids=lambda v: v)
def test_a_cut_mid_run_ends_with_a_clean_audit_after_the_heal(lab, tmp_path, a, b, how):
    steps, cut_at, cut_s = 12, 3, 20.0
    run = start_lab_run(lab, DEMO, tmp_path / "run", demo(steps))
    wait_for(lambda: steps_done(run.run_dir) >= cut_at, 300, f"{cut_at} steps", run_dir=run.run_dir)
    lab.cut(a, b, reject=how == "reject", one_way=how == "one_way")
    time.sleep(cut_s)
    lab.heal(a, b)
    clean(run.wait(600))


def test_a_flapping_link_ends_with_a_clean_audit(lab, tmp_path):
    steps, flaps = 12, 5
    run = start_lab_run(lab, DEMO, tmp_path / "run", demo(steps))
    wait_for(lambda: steps_done(run.run_dir) >= 2, 300, "2 steps", run_dir=run.run_dir)
    for _ in range(flaps):
        lab.link(replica_host(1), up=False)
        time.sleep(3)
        lab.link(replica_host(1))
        time.sleep(3)
    clean(run.wait(600))
