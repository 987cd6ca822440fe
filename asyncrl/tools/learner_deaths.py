"""Why a learner process died, and whether `up` may start it again: a restart must not walk into the cause of
the last death unchanged.

- exit status 2: the learner refused its settings (a config error, its memory plan among them): a restart would
  refuse them again, so the run stops and says so;
- SIGKILL while the kernel's count of out-of-memory kills rose (`/proc/vmstat` oom_kill): the restart gives up
  what costs memory but not correctness (the background checkpoint's copy, the background push's snapshot;
  docs/architecture.md "Memory"); with both already off the run stops instead of dying the same way again;
- anything else (a crash, a `kill -9` by hand): restarted as it was.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

CONFIG_ERROR_EXIT = 2
"""The CLI's exit status for a config error (`asyncrl.tools.cli`)."""

MEMORY_SETTINGS = ("learner.checkpoint.background", "learner.push_in_background")
"""Turned off (in this order, all at once) for a learner the out-of-memory killer ended."""


@dataclass(frozen=True, kw_only=True)
class Verdict:
    cause: str
    """"config_error", "out_of_memory", "killed" or "error"."""
    restart: bool
    turn_off: tuple[str, ...] = ()
    """Settings the restart sets to false."""
    why: str = ""
    """What the console and the learner's `learner_died` record say."""


def oom_kills(vmstat: str = "/proc/vmstat") -> int | None:
    """The kernel's count of out-of-memory kills since boot (None where it is not told)."""
    try:
        for line in Path(vmstat).read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def judge(exit_code: int, oom_kills_rose: bool, still_on: tuple[str, ...]) -> Verdict:
    """What to make of a learner that ended with `exit_code` (negative: the signal), given whether the kernel's
    OOM kill count rose meanwhile and which of `MEMORY_SETTINGS` the next start would still have on."""
    if exit_code == CONFIG_ERROR_EXIT:
        return Verdict(cause="config_error", restart=False,
                       why="not restarted: the learner refused its settings (exit 2, the error above); a restart "
                           "would refuse them again")
    if exit_code == -signal.SIGKILL and oom_kills_rose:
        if still_on:
            return Verdict(cause="out_of_memory", restart=True, turn_off=still_on,
                           why=f"killed by the kernel's out-of-memory killer: restarted with {', '.join(still_on)} "
                               "off (they cost memory, not correctness)")
        return Verdict(cause="out_of_memory", restart=False,
                       why="not restarted: killed by the kernel's out-of-memory killer with the background checkpoint "
                           "and push already off, a restart would die the same way; give the learner more memory, "
                           "or use a smaller model.dtype or model")
    if exit_code == -signal.SIGKILL:
        return Verdict(cause="killed", restart=True, why="killed (SIGKILL, not by the out-of-memory killer): restarted")
    return Verdict(cause="error", restart=True, why=f"exited with {exit_code}: restarted")
