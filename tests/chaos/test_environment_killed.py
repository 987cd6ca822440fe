"""The agent demo whose tool calls an environment server process (tests/env_server.py): the server is killed
with SIGKILL mid-run and started again a few seconds later. Meanwhile every tool call fails and the model reads
the error; no replica wedges or dies of it, the learner keeps training, and the run completes with a clean
audit (admission and consumption staleness)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from asyncrl.core.events import read_events
from tests.run_helpers import REPO, running_up, steps_done, wait_for

pytestmark = pytest.mark.chaos

STEPS, KILL_AT, DOWN_S = 40, 12, 6.0


def start_server(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "env_server.py"), str(port)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_an_environment_server_killed_mid_run(tmp_path, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("ASYNCRL_TEST_ENV_URL", f"http://127.0.0.1:{port}")  # the replicas inherit it
    run_dir = tmp_path / "run"
    args = ["--config", str(REPO / "examples/tool-agent.yaml")]
    for override in (f"run_dir={run_dir}", f"learner.total_steps={STEPS}", "learner.eval_every=0",
                     f"environment.tools=[{REPO}/tests/env_tools.py:add]"):
        args += ["--set", override]
    server = start_server(port)
    try:
        with running_up(*args) as proc:
            wait_for(lambda: steps_done(run_dir) >= KILL_AT, 600, f"{KILL_AT} steps", run_dir=run_dir)
            os.kill(server.pid, signal.SIGKILL)
            server.wait()
            killed_at = steps_done(run_dir)
            time.sleep(DOWN_S)
            server = start_server(port)
            out, _ = proc.communicate(timeout=900)
    finally:
        server.kill()
    assert proc.returncode == 0 and "[up] audit OK" in out, out[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    audit = summary["audit"]
    assert audit["lost"] == [] and audit["trained_beyond_eta"] == [] and audit["eta_violations"] == []
    trained = [e for e in read_events(run_dir, "learner") if e["kind"] == "step"]
    assert [e["version"] for e in trained] == list(range(1, STEPS + 1))
    assert steps_done(run_dir) > killed_at  # it trained on while the server was down and after
    # No replica died of it: every replica's log has one start.
    for log in (run_dir / "logs").glob("rollout-*.log"):
        assert "rollout loop died" not in log.read_text(errors="replace"), log.name
