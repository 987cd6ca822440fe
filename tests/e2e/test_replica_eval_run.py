"""`asyncrl up` with `learner.eval_by: replica`: the evaluations every `eval_every` steps are run by a live
replica through its Generate RPC while the learner trains (each names the replica and the weight versions its
tokens came from, at most one version behind the learner's when it was asked for), the first and the last by
the learner; the audit is clean."""

from __future__ import annotations

import pytest

from asyncrl.core.runtime.events import read_events
from tests.e2e.test_system import asyncrl_up, no_process_left

pytestmark = pytest.mark.e2e

STEPS, EVERY = 30, 10


def test_replicas_run_the_periodic_evaluations_while_the_learner_trains(tmp_path):
    run_dir = tmp_path / "run"
    summary = asyncrl_up(run_dir, f"learner.total_steps={STEPS}", f"learner.eval_every={EVERY}",
                         "learner.eval_by=replica", timeout_s=600)
    assert summary["audit"]["ok"], summary["audit"]
    evals = [e for e in read_events(run_dir, "learner") if e["kind"] == "eval"]
    assert [e["step"] for e in evals] == list(range(0, STEPS + 1, EVERY))
    first, *periodic, last = evals
    assert first["by"] == last["by"] == "learner"
    assert periodic and all(e["by"] == "replica" for e in periodic), periodic
    for e in periodic:
        assert e["replica_id"].startswith("replica-")
        low, high = e["weight_versions"]
        assert e["version"] - 1 <= low <= high, e  # the newest weights a replica held, pushes landing meanwhile
        assert 0.0 <= e["accuracy"] <= 1.0
    no_process_left(run_dir)
