"""`asyncrl up` as a user drives it: SIGTERM stops the run cleanly (children stopped, learner's step finished,
audit clean), fixed rollout ports count up per replica, --log-level reaches every process."""

from __future__ import annotations

import signal
import urllib.request

import pytest

from tests.e2e.test_system import DEMO_CONFIG, no_process_left
from tests.run_helpers import running_up, steps_done, stopped_intact, wait_for

pytestmark = pytest.mark.e2e


def test_sigterm_stops_the_run_cleanly(tmp_path, monkeypatch):
    from asyncrl.tools.processes import free_port_run

    monkeypatch.setenv("ASYNCRL_LOG_LEVEL", "WARNING")  # = `asyncrl --log-level WARNING up ...`
    run_dir, metrics_port = tmp_path / "run", free_port_run(2)
    args = ["--config", str(DEMO_CONFIG), "--set", f"run_dir={run_dir}", "--set", "learner.total_steps=1000",
            "--set", f"rollout.metrics_port={metrics_port}"]
    with running_up(*args) as proc:
        wait_for(lambda: proc.poll() is not None or steps_done(run_dir) >= 5, 300, "5 learner steps")
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        for port in (metrics_port, metrics_port + 1):  # replica i serves metrics on the configured port + i
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
                assert b"asyncrl_rollout" in answer.read()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-3000:]
    assert "[up] interrupted; stopping" in out and "Traceback" not in out, out[-3000:]
    assert stopped_intact(out), out[-3000:]
    no_process_left(run_dir)
    # The log level reached the learner: none of its INFO lines (an eval line per eval) in its log.
    assert "asyncrl.learner INFO" not in (run_dir / "logs" / "learner.log").read_text()


def test_two_ups_started_together_each_get_their_own_run(tmp_path):
    """Same config, same run_dir template, started in the same second: two run directories, two sets of
    ports, two clean audits."""
    args = ["--config", str(DEMO_CONFIG), "--set", f"run_dir={tmp_path}/run-{{time}}", "--set", "learner.total_steps=3",
            "--set", "rollout.replicas=1", "--set", "learner.eval_every=0"]
    with running_up(*args) as first, running_up(*args) as second:
        outputs = [proc.communicate(timeout=300)[0] for proc in (first, second)]
    for proc, out in zip((first, second), outputs):
        assert proc.returncode == 0, out[-3000:]
        assert "[up] audit OK" in out and " 0 lost" in out, out[-3000:]
    run_dirs = sorted(p for p in tmp_path.iterdir() if p.name.startswith("run-"))
    assert len(run_dirs) == 2 and all((d / "summary.json").exists() for d in run_dirs), run_dirs
    for run_dir in run_dirs:
        no_process_left(run_dir)
