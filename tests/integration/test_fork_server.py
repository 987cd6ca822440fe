"""`launch.services: fork`: services forked from one fork server are processes like spawned ones. Their parent
is `up` (it reads their exit codes), each leads a session of its own with exactly the environment it was
given, its output in its log file and its own command line; a fork server that dies leaves `up` spawning fresh
interpreters, and what a service left behind is reaped, not kept as a zombie."""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest

from asyncrl.tools.processes import ProcessGroup, process_argv
from asyncrl.tools.spawners import ForkedProcess, ForkServerSpawner

pytestmark = pytest.mark.integration


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _group(log_dir: Path) -> ProcessGroup:
    # ASYNCRL_NOT_GIVEN: the fork server's own environment, which no service it forks may keep.
    return ProcessGroup(log_dir, ForkServerSpawner({**os.environ, "PYTHONUNBUFFERED": "1",
                                                   "ASYNCRL_NOT_GIVEN": "leaked"}))  # fmt: skip


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    """One fork server for the tests that leave it running (its imports take seconds)."""
    group = _group(tmp_path_factory.mktemp("forked") / "logs")
    yield group
    group.stop_all(grace_s=5.0)


@pytest.fixture
def own_group(tmp_path):
    group = _group(tmp_path / "logs")
    yield group
    group.stop_all(grace_s=5.0)


REPO = Path(__file__).resolve().parents[2]


def test_a_forked_service_is_our_child_in_its_own_session_with_its_env_log_and_command_line(
    group, tmp_path, tiny_model_dir
):
    seen = tmp_path / "seen.txt"
    reward = tmp_path / "reward.py"  # runs in the check: it writes down the environment it sees
    reward.write_text(
        "import os, pathlib\n"
        f"pathlib.Path({str(seen)!r}).write_text(os.environ.get('ASYNCRL_PROBE', '-') + ' ' + "
        "os.environ.get('ASYNCRL_NOT_GIVEN', '-'))\n"
        "def score(response, metadata):\n    return 1.0\n"
    )
    child = group.start("check", [sys.executable, "-m", "asyncrl.tools.cli", "check",
                                  "--config", str(REPO / "examples" / "tiny-arith.yaml"),
                                  "--set", "model.build_tiny=false", "--set", f"model.path={tiny_model_dir.policy}",
                                  "--set", "teacher.enabled=false", "--set", "learner.algo.opd.enabled=false",
                                  "--set", "reward.type=function", "--set", f"reward.function={reward}:score"],
                        env={"ASYNCRL_PROBE": "forked"})  # fmt: skip
    assert isinstance(child.proc, ForkedProcess), group.spawner.why_not
    _state, ppid, pgrp, session = _stat(child.proc.pid)[:4]
    assert int(ppid) == os.getpid()
    assert int(pgrp) == int(session) == child.proc.pid  # leads a session and a process group of its own
    title = "asyncrl.tools.cli check --config"
    deadline = time.monotonic() + 10  # the child retitles itself first thing after the fork
    while title not in (cmdline := Path(f"/proc/{child.proc.pid}/cmdline").read_bytes().decode()):
        assert time.monotonic() < deadline, cmdline
        time.sleep(0.01)
    assert child.proc.wait(timeout=120) == 0, child.tail()
    assert "can run" in child.log_path.read_text()
    assert seen.read_text() == "forked -"


def test_a_refused_config_exits_2_with_its_message_in_the_log(group, tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("learner:\n  no_such_key: 1\n")
    child = group.start_cli("check", ["check", "--config", str(config)])
    assert isinstance(child.proc, ForkedProcess), group.spawner.why_not
    assert child.proc.wait(timeout=60) == 2  # the config error's exit code, read by the parent
    log = child.log_path.read_text()
    assert "asyncrl check: config error: learner.no_such_key" in log, log


CONTROLLER = "buffer:\n  type: memory\ncontroller:\n  state_store: none\n  port: 0\n  status_port: 0\nsecurity:\n  insecure: true\n"


def _serving(child) -> None:
    deadline = time.monotonic() + 60
    while "listening" not in child.log_path.read_text(errors="replace"):
        assert child.proc.poll() is None and time.monotonic() < deadline, child.tail()
        time.sleep(0.05)


def test_a_forked_service_stops_on_sigterm_and_a_killed_one_reports_the_signal(group, tmp_path):
    config = tmp_path / "controller.yaml"
    config.write_text(CONTROLLER)
    stopped = group.start_cli("stopped", ["controller", "--config", str(config)])
    killed = group.start_cli("killed", ["controller", "--config", str(config)])
    assert isinstance(stopped.proc, ForkedProcess) and isinstance(killed.proc, ForkedProcess)
    _serving(stopped)
    _serving(killed)
    stopped.proc.terminate()
    assert stopped.proc.wait(timeout=30) == 0, stopped.tail()  # stopped in order, as `up` stops a run
    os.kill(killed.proc.pid, signal.SIGKILL)
    t0 = time.monotonic()
    group.wait_for_an_exit(10.0)
    assert time.monotonic() - t0 < 2.0
    assert killed.proc.poll() == -signal.SIGKILL
    assert killed in group.failed() and stopped not in group.failed()


def test_without_the_fork_server_services_start_as_new_processes(own_group):
    group = own_group
    first = group.start_cli("first", ["config-schema"])
    assert isinstance(first.proc, ForkedProcess)
    assert first.proc.wait(timeout=60) == 0
    [server] = group.spawner.own_pids()
    os.kill(server, signal.SIGKILL)
    second = group.start_cli("second", ["config-schema"])
    assert not isinstance(second.proc, ForkedProcess)
    assert "exited" in (group.spawner.why_not or "")
    assert second.proc.wait(timeout=120) == 0
    assert second.log_path.read_text().lstrip().startswith("{")


def test_what_a_service_left_running_is_reaped_once_it_ends(group, tmp_path):
    pid_file = tmp_path / "orphan.pid"
    # The shell exits at once; its background child is orphaned and adopted by this process (the subreaper).
    shell = group.start("shell", ["bash", "-c", f"sleep 0.3 & echo $! > {pid_file}"])
    assert shell.proc.wait(timeout=10) == 0
    orphan = int(pid_file.read_text())
    assert int(_stat(orphan)[1]) == os.getpid()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{orphan}").exists():
        assert time.monotonic() < deadline, f"the orphan {orphan} stayed: {_stat(orphan)[0]}"
        group.wait_for_an_exit(0.1)
    assert sys.platform == "linux"


def _fork_servers(marked: str) -> set[int]:
    """The fork servers alive now whose environment holds `ASYNCRL_TEST_MARK=marked`: started by this test's
    command, not by a run on the suite's other worker."""
    pids = set()
    for entry in Path("/proc").iterdir():
        try:
            if (entry.name.isdigit() and "asyncrl.tools.fork_server" in process_argv(int(entry.name))
                    and f"ASYNCRL_TEST_MARK={marked}".encode() in (entry / "environ").read_bytes()):
                pids.add(int(entry.name))
        except (OSError, ValueError):  # gone meanwhile, or a title shlex cannot split
            continue
    return pids


def test_asyncrl_up_starts_its_fork_server_first_and_a_refused_config_leaves_none(tmp_path):
    """`asyncrl up` starts the fork server in its first lines (its imports overlap `up` reading the config);
    the spawner takes that one, and one nobody takes is killed when the command exits."""
    import subprocess

    from asyncrl.tools import spawners

    mark = uuid.uuid4().hex
    refused = subprocess.run([sys.executable, "-m", "asyncrl", "up", "--config", str(tmp_path / "missing.yaml")],
                             check=False, cwd=REPO, capture_output=True, text=True, timeout=60,
                             env={**os.environ, "ASYNCRL_TEST_MARK": mark})  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert "asyncrl up: config error" in refused.stderr
    assert _fork_servers(mark) == set()

    spawners.prestart_fork_server({**os.environ, "PYTHONUNBUFFERED": "1"})
    [prestarted] = spawners._prestarted
    group = ProcessGroup(tmp_path / "logs", spawners.make_spawner("fork"))
    try:
        assert group.spawner.own_pids() == {prestarted.pid} and not spawners._prestarted
        child = group.start_cli("schema", ["config-schema"])
        assert isinstance(child.proc, ForkedProcess)
        assert child.proc.wait(timeout=120) == 0
    finally:
        group.stop_all(grace_s=5.0)

    spawners.prestart_fork_server({**os.environ, "PYTHONUNBUFFERED": "1"})
    [unused] = spawners._prestarted
    spawners.make_spawner("spawn")  # `launch.services: spawn` kills the one started for nothing
    assert unused.poll() is not None and not spawners._prestarted
