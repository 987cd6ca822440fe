"""`ProcessGroup.wait_for_an_exit`, the supervisor's wait: it wakes when a child dies, not on its next tick."""

from __future__ import annotations

import signal
import time

from asyncrl.tools.processes import ProcessGroup


def test_the_wait_ends_when_a_child_is_killed_not_at_its_time_out(tmp_path):
    group = ProcessGroup(tmp_path)
    try:
        group.start("long", ["sleep", "60"])
        victim = group.start("victim", ["sleep", "60"])
        t0 = time.monotonic()
        group.wait_for_an_exit(0.3)  # nothing exits: the whole time-out
        assert 0.25 <= time.monotonic() - t0 < 2.0
        victim.proc.send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        group.wait_for_an_exit(10.0)
        assert time.monotonic() - t0 < 2.0
        assert group.failed() == [victim]
        t0 = time.monotonic()
        group.wait_for_an_exit(0.3)  # a child already gone does not wake the next wait
        assert time.monotonic() - t0 >= 0.25
    finally:
        group.stop_all(grace_s=2.0)


def test_a_child_dead_before_the_wait_looks_ends_the_wait_at_once(tmp_path):
    # The flake this pins down: a child that died just before the wait looked was reaped by the wait's own poll
    # and left unwatched, and the wait slept its whole time-out on the others.
    group = ProcessGroup(tmp_path)
    try:
        group.start("long", ["sleep", "60"])
        victim = group.start("victim", ["sleep", "60"])
        victim.proc.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not _gone(victim.proc.pid):  # dead, not reaped, before the wait looks
            assert time.monotonic() < deadline
            time.sleep(0.01)
        t0 = time.monotonic()
        group.wait_for_an_exit(10.0)
        assert time.monotonic() - t0 < 2.0
        t0 = time.monotonic()
        group.wait_for_an_exit(0.3)  # seen once: it does not wake the next wait
        assert time.monotonic() - t0 >= 0.25
    finally:
        group.stop_all(grace_s=2.0)


def _gone(pid: int) -> bool:
    """No such process, or only its zombie (whoever adopted it has not reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_what_a_killed_child_left_running_in_its_group_is_killed_too(tmp_path):
    # A vLLM replica's engine processes outlive a SIGKILL of the replica: `up` kills them before a restart.
    group = ProcessGroup(tmp_path)
    pid_file = tmp_path / "grandchild.pid"
    try:
        child = group.start("replica", ["bash", "-c", f"sleep 60 & echo $! > {pid_file}; wait"])
        deadline = time.monotonic() + 10
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        grandchild = int(pid_file.read_text())
        child.kill_leftovers()  # alive: nothing happens
        assert not _gone(grandchild)
        child.proc.send_signal(signal.SIGKILL)
        child.proc.wait()
        assert not _gone(grandchild)  # the orphan runs on, as vLLM's engine did
        child.kill_leftovers()
        deadline = time.monotonic() + 5
        while not _gone(grandchild):
            assert time.monotonic() < deadline, "the orphan survived"
            time.sleep(0.02)
    finally:
        group.stop_all(grace_s=2.0)
