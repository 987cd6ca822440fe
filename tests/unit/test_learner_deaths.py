"""A learner death and what `up` does about it (`asyncrl.tools.learner_deaths`): never a restart into the same
cause. The table is written out by hand (the supervisor acting on it: tests/integration/test_learner_deaths_up.py)."""

import signal

import pytest

from asyncrl.tools.learner_deaths import MEMORY_SETTINGS, judge, oom_kills

KILL = -signal.SIGKILL
BOTH = MEMORY_SETTINGS
CHECKPOINT = ("learner.checkpoint.background",)

# (exit code, OOM kill count rose, settings still on) -> (cause, restart, settings turned off)
TABLE = [
    (2, False, BOTH, "config_error", False, ()),
    (2, True, BOTH, "config_error", False, ()),
    (KILL, True, BOTH, "out_of_memory", True, BOTH),
    (KILL, True, CHECKPOINT, "out_of_memory", True, CHECKPOINT),
    (KILL, True, (), "out_of_memory", False, ()),
    (KILL, False, BOTH, "killed", True, ()),
    (1, True, BOTH, "error", True, ()),
    (-signal.SIGSEGV, False, BOTH, "error", True, ()),
]


@pytest.mark.parametrize("code, rose, on, cause, restart, turn_off", TABLE)
def test_the_verdict_of_every_kind_of_death(code, rose, on, cause, restart, turn_off):
    verdict = judge(code, rose, on)
    assert (verdict.cause, verdict.restart, verdict.turn_off) == (cause, restart, turn_off)
    assert verdict.why.startswith("not restarted") != restart


def test_the_kernels_oom_kill_count_is_read(tmp_path):
    (tmp_path / "vmstat").write_text("nr_free_pages 12\noom_kill 3\n")
    assert oom_kills(str(tmp_path / "vmstat")) == 3
    assert oom_kills(str(tmp_path / "missing")) is None
    assert isinstance(oom_kills(), int | None)
