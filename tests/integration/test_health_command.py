"""`asyncrl health`, the containers' health check: it finds the role and config of a real service process
from its command line, answers 0 while the service is SERVING and 1 once it is gone."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import yaml

from asyncrl.tools.processes import free_port
from tests.run_helpers import REPO, wait_for

pytestmark = pytest.mark.integration


def health(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "asyncrl.tools.cli", "health", *args], cwd=REPO, check=False,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_health_of_a_controller_process(tmp_path):
    port = free_port("127.0.0.1")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "run"), "buffer": {"type": "memory"},
                                      "controller": {"port": 50051, "status_port": 0, "state_store": "none"}}))
    env = {**os.environ, "ASYNCRL_TOKEN": "t" * 32}
    # The port given on the command line, as a container's command would: `health` must read it from there.
    proc = subprocess.Popen([sys.executable, "-m", "asyncrl.tools.cli", "controller", "--config", str(config),
                             "--set", f"controller.port={port}"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def serving() -> bool:
            assert proc.poll() is None, "the controller exited"
            return health("--pid", str(proc.pid)).returncode == 0

        wait_for(serving, 60, "the controller to serve", poll_s=0.5)
        found = health("--pid", str(proc.pid))
        assert found.stdout.strip() == f"controller at 127.0.0.1:{port}: SERVING"
        explicit = health("controller", "--config", str(config), "--set", f"controller.port={port}")
        assert explicit.returncode == 0, explicit.stdout + explicit.stderr
    finally:
        proc.terminate()
        proc.wait(30)
    gone = health("controller", "--config", str(config), "--set", f"controller.port={port}", "--timeout", "1")
    assert gone.returncode == 1 and "UNAVAILABLE" in gone.stdout, gone.stdout + gone.stderr


def test_health_of_a_process_that_is_no_service():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.2)
        result = health("--pid", str(sleeper.pid))
        assert result.returncode == 0 and "runs no service" in result.stdout
    finally:
        sleeper.kill()
        sleeper.wait()


def test_health_refuses_a_random_port(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "run"), "learner": {"port": 0}}))
    result = health("learner", "--config", str(config))
    assert result.returncode == 2 and "learner.port" in result.stderr, result.stderr
