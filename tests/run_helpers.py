"""Helpers of the tests that drive `asyncrl up` as a subprocess: waiting on a run's event logs."""

from __future__ import annotations

import time
from pathlib import Path

from asyncrl.core.events import read_events


def steps_done(run_dir: Path) -> int:
    """Learner `step` records written so far (0 before the run has an events folder)."""
    return sum(e["kind"] == "step" for e in read_events(run_dir, "learner")) if (run_dir / "events").exists() else 0


def wait_for(predicate, timeout_s: float, what: str, poll_s: float = 0.3) -> None:
    deadline = time.time() + timeout_s
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(poll_s)
