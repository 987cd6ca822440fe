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
