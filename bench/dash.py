"""DASH on the demo: preemptive sampling and gradient filtering against a standard GRPO set-up, on-policy
(η = 0, as in the DASH paper), equal sample budgets, several seeds, one sitting.

- baseline : one prompt group per engine call (`rollout.leases_per_batch=1`: 8 sequences per decode batch),
             the whole mini-batch in one forward/backward, every sequence trained on;
- preemptive: the whole learner batch generated in one engine call (`rollout.leases_per_batch=8`: 64
             sequences per decode batch) and trained in small micro-batches (`learner.microbatch_tokens`);
- dash     : preemptive sampling plus gradient filtering (`learner.algo.advantage.dash_threshold=0.1`:
             sequences whose max |A_t| is below 0.1 skip the forward/backward).

Reported per arm: wall time of the run (first step to last), seconds per step, the final greedy held-out
accuracy (mean and spread over seeds), the fraction of sequences DASH dropped; and the wall time saved by
DASH against the baseline.

    .venv/bin/python bench/dash.py [--steps 100] [--seeds 3]
    (or: asyncrl bench dash)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from common import emit
from demo_runs import run_demo

ARMS = {
    "baseline": ["rollout.leases_per_batch=1"],
    "preemptive": ["rollout.leases_per_batch=8", "learner.microbatch_tokens=256"],
    "dash": ["rollout.leases_per_batch=8", "learner.microbatch_tokens=256",
             "learner.algo.advantage.dash_threshold=0.1"],
}


def run(arm: str, seed: int, steps: int, run_dir: Path) -> dict:
    events = run_demo(run_dir, ["controller.eta=0", f"learner.total_steps={steps}", f"learner.eval_every={steps}",
                                f"seed={seed}", *ARMS[arm]])
    steps_ev = [e for e in events if e["kind"] == "step"]
    evals = [e for e in events if e["kind"] == "eval"]
    wall = steps_ev[-1]["t"] - (steps_ev[0]["t"] - steps_ev[0]["time/step_s"])
    return {"wall_s": wall, "step_s": wall / len(steps_ev), "final_accuracy": evals[-1]["accuracy"],
            "first_accuracy": evals[0]["accuracy"],
            "train_step_s": statistics.median(e["time/step_s"] for e in steps_ev),
            "dropped_frac": statistics.mean(e.get("adv/dash_dropped_frac", 0.0) for e in steps_ev)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            for arm in ARMS:
                result = run(arm, seed, args.steps, Path(tmp) / f"{arm}-{seed}")
                runs[arm].append(result)
                print(f"{arm} seed={seed}: accuracy {result['final_accuracy']:.3f} in {result['wall_s']:.1f} s",
                      file=sys.stderr, flush=True)
    arms = {}
    for arm, results in runs.items():
        finals = [r["final_accuracy"] for r in results]
        arms[arm] = {
            "overrides": ARMS[arm],
            "wall_s_mean": statistics.mean(r["wall_s"] for r in results),
            "step_s_mean": statistics.mean(r["step_s"] for r in results),
            "train_step_s_mean": statistics.mean(r["train_step_s"] for r in results),
            "final_accuracy_mean": statistics.mean(finals),
            "final_accuracy_stdev": statistics.stdev(finals) if len(finals) > 1 else 0.0,
            "final_accuracies": finals,
            "dropped_frac_mean": statistics.mean(r["dropped_frac"] for r in results),
        }
    base, dash = arms["baseline"], arms["dash"]
    result = {
        "steps": args.steps, "seeds": args.seeds, "eta": 0, "first_accuracy": runs["baseline"][0]["first_accuracy"],
        "arms": arms,
        "dash_wall_time_saved": 1 - dash["wall_s_mean"] / base["wall_s_mean"],
        "preemptive_wall_time_saved": 1 - arms["preemptive"]["wall_s_mean"] / base["wall_s_mean"],
        "dash_minus_baseline_accuracy_points": 100 * (dash["final_accuracy_mean"] - base["final_accuracy_mean"]),
    }
    emit("dash", result, {arm: arms[arm]["wall_s_mean"] for arm in ARMS}, "wall seconds per run (mean over seeds)",
         f"DASH on the demo: {100 * result['dash_wall_time_saved']:.0f}% wall time saved, accuracy "
         f"{result['dash_minus_baseline_accuracy_points']:+.1f} points")


if __name__ == "__main__":
    main()
