"""The run's plot, drawn after `asyncrl up` has exited: matplotlib's imports and the drawing took 2.4 s of the
2.9 s between a run's last step and `up`'s exit on two cores, and nothing `up` reports waits for them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run_plot_path(run_dir: str | Path) -> Path:
    """Where `asyncrl plot RUN_DIR` draws a run."""
    return Path(run_dir) / "plots" / "run.png"


def plot_later(run_dir: str | Path) -> Path:
    """Start `asyncrl plot RUN_DIR` in a session of its own that outlives `up` (its output in
    `logs/plot.log`); the path the plot will have."""
    log_path = Path(run_dir) / "logs" / "plot.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log, open("/dev/null", "rb") as null:
        subprocess.Popen([sys.executable, "-m", "asyncrl.tools.cli", "plot", str(run_dir)], stdin=null, stdout=log,
                         stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    return run_plot_path(run_dir)
