"""`up`'s supervisor on real dead learner processes: an out-of-memory kill is restarted without the background
copies, then not again into the same cause; a config error is not restarted; every death is in the learner's
log (`learner_died`)."""

import signal
import sys

import pytest

from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.core.records.learner import LearnerDied
from asyncrl.core.runtime.events import read_records
from asyncrl.tools.processes import ProcessGroup
from asyncrl.tools.supervisor import Restartable, Supervisor

pytestmark = pytest.mark.integration

KILL = -signal.SIGKILL


def died(group: ProcessGroup, how: str):
    """A real child process that ends `how` ("kill": SIGKILL on itself, else that exit status)."""
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)" if how == "kill" else f"raise SystemExit({how})"
    child = group.start("learner", [sys.executable, "-c", code])
    child.proc.wait()
    return child


def test_up_restarts_an_oom_killed_learner_without_its_background_copies_and_then_stops(tmp_path):
    cfg = AsyncRLConfig.model_validate({"run_dir": str(tmp_path)})
    group, vmstat = ProcessGroup(tmp_path / "logs"), tmp_path / "vmstat"
    vmstat.write_text("oom_kill 0\n")
    learner = Restartable(died(group, "kill"), ["schema"], None, max_restarts=5)
    supervisor = Supervisor(cfg, group, learner, {}, vmstat=str(vmstat))
    try:
        vmstat.write_text("oom_kill 1\n")  # the kernel killed something meanwhile: this learner
        assert supervisor._restart_learner(learner.child.proc.returncode)
        assert learner.argv == ["schema", "--set", "learner.checkpoint.background=false",
                                "--set", "learner.push_in_background=false"]
        learner.child = died(group, "kill")  # the same death again, nothing left to give up
        vmstat.write_text("oom_kill 2\n")
        assert not supervisor._restart_learner(learner.child.proc.returncode)
        learner.child = died(group, "kill")  # a kill -9 by hand: the count did not rise
        assert supervisor._restart_learner(learner.child.proc.returncode)
        learner.child = died(group, "2")
        assert not supervisor._restart_learner(2)
    finally:
        group.stop_all(grace_s=5)
    deaths = [r for r in read_records(tmp_path, "learner") if isinstance(r, LearnerDied)]
    assert [(d.exit_code, d.cause, d.action.split(":")[0]) for d in deaths] == [
        (KILL, "out_of_memory", "killed by the kernel's out-of-memory killer"),
        (KILL, "out_of_memory", "not restarted"),
        (KILL, "killed", "killed (SIGKILL, not by the out-of-memory killer)"),
        (2, "config_error", "not restarted"),
    ]
    assert learner.restarts == 2
