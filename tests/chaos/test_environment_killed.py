"""The agent demo whose environment is a server process, killed with SIGKILL mid-run and started again a few
seconds later: a tool server the `add` tool calls (tests/env_server.py; every call fails meanwhile and the model
reads the error), and the same tool served as an OpenEnv environment (examples/agent/openenv_calculator.py;
the episodes it held end as environment errors, new ones fail at their start and their groups are not
written, their quota back). No replica wedges or dies of it, the learner keeps training, and the run
completes with a clean audit (admission and consumption staleness)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from asyncrl.core.config.file import load_config
from asyncrl.core.runtime.events import read_events
from asyncrl.tools.models_ready import ensure_models
from asyncrl.tools.processes import free_port
from tests.conftest import example_overrides
from tests.e2e.test_agent_run import EVAL_PROMPTS
from tests.run_helpers import REPO, running_up, steps_done, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.example_model("tool-agent")]

STEPS, KILL_AT, DOWN_S = 16, 8, 6.0
AGENT_EXAMPLE = REPO / "examples" / "tool-agent.yaml"



def start_tool_server(port: int, _log) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "env_server.py"), str(port)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def start_openenv_server(port: int, log) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(REPO / "examples" / "agent" / "openenv_calculator.py"),
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc
        except OSError:
            assert time.monotonic() < deadline, "the OpenEnv server did not start"
            time.sleep(0.1)


def kill_the_server_mid_run(tmp_path, start_server, overrides: list[str], steps: int = STEPS,
                            kill_at: int = KILL_AT) -> dict:
    """Run the agent demo with `overrides` against the server `start_server(port, log)` starts; SIGKILL it at
    step `kill_at` and start it again DOWN_S later. Returns the run's audit, after the checks every backend
    shares (multi-turn episodes trained, with the environment's tokens in them)."""
    port = free_port()
    run_dir = tmp_path / "run"
    args = ["--config", str(REPO / "examples/tool-agent.yaml")]
    for override in (*example_overrides("tool-agent"), f"run_dir={run_dir}", f"learner.total_steps={steps}",
                     "learner.eval_every=0", EVAL_PROMPTS,
                     *[o.format(port=port, tmp=tmp_path) for o in overrides]):
        args += ["--set", override]
    log = (tmp_path / "server.log").open("w")
    server = start_server(port, log)
    try:
        with running_up(*args) as proc:
            wait_for(lambda: steps_done(run_dir) >= kill_at, 600, f"{kill_at} steps", run_dir=run_dir)
            os.kill(server.pid, signal.SIGKILL)
            server.wait()
            killed_at = steps_done(run_dir)
            time.sleep(DOWN_S)
            server = start_server(port, log)
            out, _ = proc.communicate(timeout=900)
    finally:
        server.kill()
        log.close()
    assert proc.returncode == 0 and "[up] audit OK" in out, out[-3000:]
    audit = json.loads((run_dir / "summary.json").read_text())["audit"]
    assert audit["lost"] == [] and audit["trained_beyond_eta"] == [] and audit["eta_violations"] == []
    trained = [e for e in read_events(run_dir, "learner") if e["kind"] == "step"]
    assert [e["version"] for e in trained] == list(range(1, steps + 1))
    assert max(e["episode/turns_mean"] for e in trained) > 1.5
    assert min(e["episode/observation_tokens_mean"] for e in trained) > 0.5
    assert steps_done(run_dir) > killed_at  # it trained on while the server was down and after
    # No replica died of it: every replica's log has one start.
    for replica_log in (run_dir / "logs").glob("rollout-*.log"):
        assert "rollout loop died" not in replica_log.read_text(errors="replace"), replica_log.name
    return audit


def test_a_tool_server_killed_mid_run(tmp_path, monkeypatch):
    port = free_port()
    monkeypatch.setenv("ASYNCRL_TEST_ENV_URL", f"http://127.0.0.1:{port}")  # the replicas inherit it
    kill_the_server_mid_run(tmp_path, lambda _port, log: start_tool_server(port, log),
                            [f"environment.tools=[{REPO}/tests/env_tools.py:add]"])


def test_an_openenv_server_killed_mid_run(tmp_path):
    """The agent demo's model trained over OpenEnv through a kill (the server answers as the demo's `add` tool
    does, so the demo's warm-started model plays it; a warm start over OpenEnv:
    tests/integration/test_openenv_environment.py)."""
    example = load_config(AGENT_EXAMPLE, example_overrides("tool-agent"))
    ensure_models(example)  # built once for the agent tests; reused as it is here
    policy = example.model.path
    audit = kill_the_server_mid_run(tmp_path, start_openenv_server, [
        "environment.type=openenv", "environment.openenv.url=http://127.0.0.1:{port}",
        "environment.openenv.observation_field=text", "environment.openenv.observation_role=tool",
        "environment.openenv.reset_fields=[answer]", f"model.path={REPO / policy}", "model.build_tiny=false",
    ])
    assert audit["skipped_unplayable"] > 0, audit  # episodes that could not start: their groups not written
