"""Evaluations off the learner's path: the demo with a held-out evaluation every `--eval-every` steps run by the
learner in line (`learner.eval_by=learner`, the baseline) against run by a rollout replica while the learner
trains (`learner.eval_by=replica`), same config otherwise, runs alternating, one sitting.

Per run: wall time of the steps (from the first step's start to the last step's end: the first evaluation,
before step 1, and the last, after it, run on the learner in both and are left out), wall time per step,
the learner's busy share (train time / wall time) over the same steps, the evaluations' own seconds and how
many ran where. The headline is the baseline's wall time over the replica arm's (best of `--trials` each).

    .venv/bin/python bench/eval_offload.py [--steps 200] [--eval-every 10] [--trials 2] [--set K=V ...]
                                           [--name SUFFIX]
    (or: asyncrl bench eval_offload)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from common import emit
from demo_runs import run_demo

ARMS = ("learner", "replica")


def run(arm: str, steps: int, eval_every: int, extra: list[str], run_dir: Path) -> dict:
    events = run_demo(run_dir, [f"learner.total_steps={steps}", f"learner.eval_every={eval_every}",
                                f"learner.eval_by={arm}", *extra])
    steps_ev = [e for e in events if e["kind"] == "step"]
    periodic = [e for e in events if e["kind"] == "eval" and 0 < e["step"] < steps]
    wall = steps_ev[-1]["t"] - (steps_ev[0]["t"] - steps_ev[0]["time/step_s"])
    return {"wall_s": wall, "step_s": wall / len(steps_ev),
            "busy": sum(e["time/step_s"] for e in steps_ev) / wall,
            "eval_s_median": statistics.median(e["seconds"] for e in periodic) if periodic else 0.0,
            "evals_on_replica": sum(e.get("by") == "replica" for e in periodic),
            "evals_on_learner": sum(e.get("by") == "learner" for e in periodic),
            "evals_skipped": sum(e["kind"] == "eval_skipped" for e in events),
            "final_accuracy": [e for e in events if e["kind"] == "eval"][-1]["accuracy"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="K=V")
    parser.add_argument("--name", default="", help="suffix of the result's name")
    args = parser.parse_args()
    best: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for trial in range(args.trials):
            for arm in ARMS:
                result = run(arm, args.steps, args.eval_every, args.extra, Path(tmp) / f"{arm}-{trial}")
                print(f"eval_by={arm} trial {trial}: {result['step_s'] * 1e3:.1f} ms/step, busy {result['busy']:.0%}",
                      flush=True)
                if arm not in best or result["wall_s"] < best[arm]["wall_s"]:
                    best[arm] = result
    result = {"steps": args.steps, "eval_every": args.eval_every, "trials": args.trials, "overrides": args.extra,
              **best, "speedup": best["learner"]["wall_s"] / best["replica"]["wall_s"]}
    emit("eval_offload" + (f"-{args.name}" if args.name else ""), result,
         {"learner evaluates": best["learner"]["step_s"] * 1e3, "a replica evaluates": best["replica"]["step_s"] * 1e3},
         "ms per learner step", f"evaluation every {args.eval_every} steps on a replica: {result['speedup']:.2f}x "
                                f"(busy {best['learner']['busy']:.0%} -> {best['replica']['busy']:.0%})")


if __name__ == "__main__":
    main()
