"""Where the seconds around a run go: from `asyncrl up` to the first learner step, and from the last step to
the exit, with the breakdown, against this machine's floor measured in the same sitting.

Each trial runs the demo as the peer comparison does (teacher off, `--steps` steps, no periodic evaluation),
reads `up`'s console lines as they arrive (each stamped on arrival) and the run's event logs, and reports:
- start: the command to `up`'s first line (the interpreter and `up`'s imports; the services start right after
  it), to `up`'s task check done (it runs while the services start), to the controller answering, to the first
  replica registered, to the learner's step-0 evaluation, to the first step;
- exit: the last step to the learner's exit, to the services stopped, to the audit printed, to the exit;
- the floor: a bare `python -c "import torch, transformers"`, the least any process of the run pays before
  its first line of asyncrl, timed alone and five at once (a run of fresh interpreters starts five such
  processes on these cores); and one interpreter importing what the fork server imports (every service's
  modules and the model's), the least a forked run waits before its services start.

The ways `up` starts its services run in the same sitting, trials interleaved: `launch.services: fork` (the
default: every service forked from one fork server that imported those modules once, the server started in
the `asyncrl` command's first lines), the same with the server started only once `up` has read its
configuration (`python -m asyncrl.tools.cli up`, as before), and `spawn` (a fresh interpreter each, the
baseline).

    .venv/bin/python bench/startup.py [--trials 3] [--steps 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import WITHOUT_TEACHER, emit

from asyncrl.core.runtime.events import read_events
from asyncrl.tools.fork_server import PRELOAD

REPO = Path(__file__).resolve().parents[1]
MARKS = {
    "first_line": "[up] run dir",
    "task_checked": "[up] started the controller",
    "controller_answers": "[up] controller grpc",
    "audit_printed": "[up] audit",
}


def imports_s(processes: int, modules: tuple[str, ...] = ("torch", "transformers")) -> float:
    """Wall seconds for `processes` interpreters importing `modules` at once."""
    started = time.perf_counter()
    code = "; ".join(f"import {m}" for m in modules)
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(processes)]
    for proc in procs:
        proc.wait()
    return time.perf_counter() - started


LAUNCHES = {"fork": ("asyncrl", "fork"), "fork_after_config": ("asyncrl.tools.cli", "fork"),
            "spawn": ("asyncrl", "spawn")}
"""Arm -> (the module `python -m` runs, `launch.services`). `asyncrl` is the `asyncrl` command, whose `up`
starts its fork server in its first lines; `asyncrl.tools.cli` runs the same `up` but starts the server only
once the configuration is read, as `up` did before."""


def trial(run_dir: Path, steps: int, arm: str) -> dict:
    module, launch = LAUNCHES[arm]
    argv = [sys.executable, "-m", module, "up", "--config", str(REPO / "examples" / "tiny-arith.yaml"),
            "--set", f"run_dir={run_dir}", "--set", f"learner.total_steps={steps}", "--set", "learner.eval_every=0",
            "--set", f"launch.services={launch}", *[a for o in WITHOUT_TEACHER for a in ("--set", o)]]
    t0 = time.time()
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seen: dict[str, float] = {}
    for line in proc.stdout:
        for mark, prefix in MARKS.items():
            if line.startswith(prefix) and mark not in seen:
                seen[mark] = time.time()
    proc.wait()
    exited = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"asyncrl up failed ({proc.returncode}); logs in {run_dir}")
    learner = read_events(run_dir, "learner")
    controller = read_events(run_dir, "controller")
    steps_at = [e["t"] for e in learner if e["kind"] == "step"]
    evals = [e["t"] for e in learner if e["kind"] == "eval"]
    registered = [e["t"] for e in controller if e["kind"] == "replica_registered"]
    learner_log = run_dir / "logs" / "learner.log"
    marks = {
        **{k: v - t0 for k, v in seen.items()},
        "first_replica_registered": min(registered) - t0 if registered else None,
        "step0_eval_done": evals[0] - t0 if evals else None,
        "first_step": steps_at[0] - t0,
        "last_step": steps_at[-1] - t0,
        "learner_log_closed": learner_log.stat().st_mtime - t0,
        "exit": exited - t0,
    }
    last = marks["last_step"]
    return {
        "start_s": marks["first_step"],
        "exit_s": marks["exit"] - last,
        "start": {k: round(v, 2) for k, v in marks.items() if v is not None and v <= marks["first_step"]},
        "after_last_step": {k: round(v - last, 2) for k, v in marks.items() if v is not None and v > last},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    floor_one = statistics.median(imports_s(1) for _ in range(3))
    floor_five = statistics.median(imports_s(5) for _ in range(3))
    preload = statistics.median(imports_s(1, PRELOAD) for _ in range(3))
    trials: dict[str, list[dict]] = {arm: [] for arm in LAUNCHES}
    for _ in range(args.trials):
        for arm in LAUNCHES:
            with tempfile.TemporaryDirectory() as tmp:
                trials[arm].append(trial(Path(tmp) / "run", args.steps, arm))
    arms = {arm: {"start_s": round(statistics.median(t["start_s"] for t in runs), 2),
                  "exit_s": round(statistics.median(t["exit_s"] for t in runs), 2), "trials": runs}
            for arm, runs in trials.items()}
    start, exit_s = arms["fork"]["start_s"], arms["fork"]["exit_s"]
    result = {"bench": "startup", "steps": args.steps, "launches": arms, "start_s": start, "exit_s": exit_s,
              "start_vs_spawn": round(start / arms["spawn"]["start_s"], 2),
              "start_vs_fork_after_config": round(start / arms["fork_after_config"]["start_s"], 2),
              "import_floor_one_s": round(floor_one, 2), "import_floor_five_s": round(floor_five, 2),
              "fork_server_imports_s": round(preload, 2),
              "targets": {"start_s": 4.0, "exit_s": 1.5}}
    emit("startup", result, {"imports (1)": floor_one, "imports (5 at once)": floor_five,
                             "the fork server's imports": preload,
                             "start to step 1 (spawn)": arms["spawn"]["start_s"],
                             "start to step 1 (fork, server after the config)": arms["fork_after_config"]["start_s"],
                             "start to step 1 (fork)": start,
                             "last step to exit (fork)": exit_s},
         "seconds", f"around a run: start {start:.1f} s (spawn {arms['spawn']['start_s']:.1f}), exit {exit_s:.1f} s "
                    "(targets 4 / 1.5)")


if __name__ == "__main__":
    main()
