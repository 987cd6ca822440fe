"""Asynchrony against heavy-tailed tools: the agent demo (examples/tool-agent.yaml) whose `add` tool takes a
lognormal time per call (median 50 ms, p99 2 s; bench/slow_tools.py), synchronous (η = 0) against η = 4, in one
sitting. At η = 4 the late groups are dropped and their prompts generated again (`learner.stale_groups: drop`,
the default), or the learner holds until they arrive (`hold`), or they are trained anyway (`train`, the
baseline that breaks η at consumption).

Per run, from the event logs: the wall time per learner step after a warm-up (the mean: the run's time over its
steps, the figure the speed-ups are taken from, which counts a hold's long waits; and the median), the
learner's busy share,
the groups dropped as stale and the prompts generated again, the groups trained beyond η, the learner's wait
for late leases per step, the mean model tokens per trajectory generated and trained (dropping late episodes
could favour short ones), the held-out success at the end.

    .venv/bin/python bench/agentic_speedup.py [--steps 40] [--trials 1]
    (or: asyncrl bench agentic_speedup)
"""

from __future__ import annotations

import argparse
import collections
import itertools
import statistics
import tempfile
from pathlib import Path

from common import emit, rollout_events
from demo_runs import run_demo

from asyncrl.core.runtime.events import read_events

WARMUP = 5
ARMS = {
    "eta0": ["controller.eta=0"],
    "eta4_drop": ["controller.eta=4", "learner.stale_groups=drop"],
    "eta4_hold": ["controller.eta=4", "learner.stale_groups=hold"],
    "eta4_train": ["controller.eta=4", "learner.stale_groups=train"],
}
COMMON = ["environment.tools=[bench/slow_tools.py:add]", "environment.workers=256",
          "environment.episodes_in_flight=192", "learner.eval_every=0"]


def run(arm: str, steps: int, run_dir: Path) -> dict:
    events = run_demo(run_dir, [*COMMON, *ARMS[arm], f"learner.total_steps={steps}"], example="tool-agent")
    trained = [e for e in events if e["kind"] == "step"]
    walls = [b["t"] - a["t"] for a, b in itertools.pairwise(trained[WARMUP:])]
    dropped = [e for e in events if e["kind"] == "group_rejected" and e["reason"].startswith("staleness")]
    written = [e for e in rollout_events(run_dir) if e["kind"] == "group_written"]
    regenerated = [e for e in read_events(run_dir, "controller") if e["kind"] == "lease_granted" and e.get("regenerated")]
    beyond_eta = sum(n for e in trained for age, n in e.get("staleness/hist", {}).items() if int(age) > 4)
    evals = [e["accuracy"] for e in events if e["kind"] == "eval"]
    return {"wall_per_step_s": statistics.mean(walls), "wall_median_per_step_s": statistics.median(walls),
            "busy": statistics.mean(e["time/busy"] for e in trained[WARMUP:]),
            "groups_dropped": len(dropped), "prompts_regenerated": len(regenerated), "groups_written": len(written),
            "trajectories_beyond_eta": beyond_eta,
            "hold_s_per_step": statistics.mean(e.get("time/stale_hold_s", 0.0) for e in trained[WARMUP:]),
            "length_generated": statistics.mean(e["length_mean"] for e in written),
            "length_trained": statistics.mean(e["response/length_mean"] for e in trained),
            "turns_trained": statistics.mean(e["episode/turns_mean"] for e in trained),
            "eval_last": evals[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--trials", type=int, default=1)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        for trial, arm in itertools.product(range(args.trials), ARMS):
            runs[arm].append(run(arm, args.steps, Path(tmp) / f"{trial}-{arm}"))
            print(arm, runs[arm][-1], flush=True)
    result = {"steps": args.steps, "trials": args.trials, "tool_latency": "lognormal, median 50 ms, p99 2 s",
              "runs": runs}
    for arm, cells in runs.items():
        for key in cells[0]:
            result[f"{arm}_{key}"] = statistics.median(c[key] for c in cells)
    for arm in ("eta4_drop", "eta4_hold", "eta4_train"):
        result[f"{arm}_speedup"] = result["eta0_wall_per_step_s"] / result[f"{arm}_wall_per_step_s"]
    emit("agentic_speedup", result, {arm.replace("_", " "): 1e3 * result[f"{arm}_wall_per_step_s"] for arm in runs},
         "wall time per learner step (ms)", "heavy-tailed tool calls: η = 0 against η = 4")


if __name__ == "__main__":
    main()
