"""What adding and removing a run costs the runs already training (`asyncrl runs add|remove`, docs/lora.md).

One deployment of examples/multi-lora.yaml with three runs alike but for their seeds (the learner pinned to
core 0, the replicas to core 1, as in bench/multi_runs.py). Once the first run has taken `--add-after` steps,
`asyncrl runs add` adds a fourth; once that one has taken `--remove-after` steps, `asyncrl runs remove` takes
out the second. For each change and each run that trains through it:
  - its step time: the median gap between its steps in the 20 s before the change;
  - its longest gap in the `--window` seconds from the change, in steps of waiting: longest / median - 1
    (a gap of two median steps is one step of waiting);
  - the same over the window as long just before the change, with nothing changing: the run's own jitter.
Also when the added run took its first step, and the removed run its last, after the command.

    .venv/bin/python bench/run_changes.py [--steps 400] [--add-after 120] [--remove-after 80] [--window 5]
    (or: asyncrl bench run_changes)
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import emit
from demo_runs import DemoInBackground
from multi_runs import LORA

from asyncrl.core.runtime.events import read_events

REPO = Path(__file__).resolve().parents[1]
RUNS, ADDED, REMOVED = ["seed-0", "seed-1", "seed-2"], "seed-3", "seed-1"
BEFORE_S = 20.0
"""The step time is the median gap over this long before a change."""


def step_times(run_dir: Path) -> list[float]:
    if not (run_dir / "events").is_dir():
        return []
    return [e["t"] for e in read_events(run_dir, "learner") if e["kind"] == "step"]


def wait_steps(run_dir: Path, steps: int, demo: DemoInBackground, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while len(step_times(run_dir)) < steps:
        if demo.done.is_set() or time.monotonic() > deadline:
            demo.events()  # raises with the run's output when it failed
            raise SystemExit(f"{run_dir.name} did not reach {steps} steps")
        time.sleep(0.2)


def longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest time between two steps over [start, end]: the gaps that overlap it, the one running at `end`
    counted up to `end` (none once the run has ended)."""
    edges = [t for t in times if t <= start][-1:] + [t for t in times if start < t <= end]
    gaps = [b - a for a, b in itertools.pairwise(edges)]
    if edges and times[-1] > end:
        gaps.append(end - edges[-1])
    return max(gaps, default=end - start)


def cost(times: list[float], at: float, window_s: float) -> dict:
    """A run's waiting around a change at `at` (see the module's docstring)."""
    gaps = [b - a for a, b in itertools.pairwise(times) if at - BEFORE_S <= a and b < at]
    median = statistics.median(gaps)
    after = longest_gap(times, at, at + window_s)
    quiet = longest_gap(times, at - window_s, at)
    return {"median_step_s": round(median, 4), "longest_gap_s": round(after, 4),
            "waiting_steps": round(after / median - 1, 2), "jitter_steps": round(quiet / median - 1, 2)}


def write_config(tmp: Path) -> Path:
    tree = yaml.safe_load((REPO / "examples" / "multi-lora.yaml").read_text())
    tree["runs"] = [{"name": name, "overrides": {"seed": i}} for i, name in enumerate(RUNS)]
    tree["rollout"]["max_runs"] = len(RUNS) + 1
    path = tmp / "runs.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def runs_command(*args: str) -> float:
    """Run `asyncrl runs ARGS`; returns when it was issued."""
    issued = time.time()
    subprocess.run([sys.executable, "-m", "asyncrl", "runs", *args], cwd=REPO, check=True, timeout=120,
                   capture_output=True)
    return issued


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400, help="steps of the three first runs")
    parser.add_argument("--add-after", type=int, default=120, help="steps of the first run before the add")
    parser.add_argument("--remove-after", type=int, default=80, help="steps of the added run before the remove")
    parser.add_argument("--window", type=float, default=5.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-", ignore_cleanup_errors=True) as tmp:
        run_dir = Path(tmp) / "run"
        overrides = [*LORA, f"learner.total_steps={args.steps}", "learner.eval_every=0", "learner.eval_prompts=20"]
        demo = DemoInBackground(run_dir, overrides, config=write_config(Path(tmp)), events_dir=run_dir / RUNS[0])
        wait_steps(run_dir / RUNS[0], args.add_after, demo)
        added_at = runs_command("add", str(run_dir), ADDED, "--set", f"seed={len(RUNS)}",
                                "--set", f"learner.total_steps={2 * args.remove_after}")
        wait_steps(run_dir / ADDED, args.remove_after, demo)
        removed_at = runs_command("remove", str(run_dir), REMOVED)
        demo.events()
        times = {run: step_times(run_dir / run) for run in [*RUNS, ADDED]}
    through = [run for run in RUNS if run != REMOVED]
    changes = {"add": {run: cost(times[run], added_at, args.window) for run in RUNS},
               "remove": {run: cost(times[run], removed_at, args.window) for run in [*through, ADDED]}}
    worst = {change: max(c["waiting_steps"] for c in costs.values()) for change, costs in changes.items()}
    result = {"runs": RUNS, "added": ADDED, "removed": REMOVED, "window_s": args.window, "lora": LORA,
              "changes": changes, "worst_waiting_steps": worst,
              "worst_jitter_steps": {change: max(c["jitter_steps"] for c in costs.values())
                                     for change, costs in changes.items()},
              "added_first_step_after_s": round(times[ADDED][0] - added_at, 2),
              "removed_last_step_after_s": round(times[REMOVED][-1] - removed_at, 2)}
    for change in changes:
        print(f"{change}: the others waited at most {worst[change]} steps (their jitter without a change: "
              f"{result['worst_jitter_steps'][change]})", file=sys.stderr, flush=True)
    emit("run_changes", result,
         {f"{change}: {kind}": result[f"worst_{kind}_steps"][change] for change in changes
          for kind in ("jitter", "waiting")},
         "steps of waiting (longest gap / median step - 1)",
         "A run added or removed live: the other runs' longest gap, against their jitter with nothing changing")


if __name__ == "__main__":
    main()
