"""Training-free process rewards against the outcome reward alone, on the demo, same steps, several seeds, one
sitting; distillation off in both arms (its per-token signal would blur the comparison).

The demo's responses are a few digits with no discourse markers, so its episodes come from the length
fallback (two tokens each) and the force-answer prompt is "=": V(prefix) asks how likely the right sum is
after the digits written so far. That is the shape of the mechanism, not the reasoning chains the seed post
targets; the costs, though, are the real ones:

- the replica's time for V(prefix): the `process_rewards_scored` records (seconds per batch, episodes scored),
  against the run's wall time;
- the learner's step: the median train step (`time/step_s`) with and without, which must not grow (the
  utilities arrive with the groups; the learner only normalises and sums them).

Accuracy: held-out greedy accuracy at the end, and at the sample budget and wall time both arms reached.

    .venv/bin/python bench/process_rewards.py [--steps 300] [--seeds 3] [--eval-every 50]
    (or: asyncrl bench process_rewards)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from common import WITHOUT_TEACHER, accuracy_at, accuracy_curve, emit, mean_sd, rollout_events, run_demo

ARMS = {
    "outcome_only": [],
    "process_rewards": ["rollout.process_rewards.enabled=true", "rollout.process_rewards.max_episode_tokens=2",
                        'rollout.process_rewards.force_answer="="'],
}


def run(arm: str, seed: int, steps: int, every: int, run_dir: Path) -> dict:
    learner = run_demo(run_dir, [*WITHOUT_TEACHER, f"learner.total_steps={steps}", f"learner.eval_every={every}",
                                 f"seed={seed}", *ARMS[arm]])
    curve = accuracy_curve(run_dir, learner, ("group_written",))
    scored = [e for e in rollout_events(run_dir) if e["kind"] == "process_rewards_scored"]
    steps_ev = [e for e in learner if e["kind"] == "step"]
    return {
        "curve": curve, "final_accuracy": curve[-1]["accuracy"], "wall_s": curve[-1]["wall_s"],
        "samples": curve[-1]["samples"],
        "train_step_s_median": statistics.median(e["time/step_s"] for e in steps_ev),
        "scoring_s_total": sum(e["seconds"] for e in scored),
        "scoring_s_per_batch": statistics.mean(e["seconds"] for e in scored) if scored else 0.0,
        "episodes_scored": sum(e["episodes"] for e in scored),
        "utility_abs_mean": statistics.mean(e.get("process/utility_abs_mean", 0.0) for e in steps_ev),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--eval-every", type=int, default=50)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            for arm in ARMS:
                result = run(arm, seed, args.steps, args.eval_every, Path(tmp) / f"{arm}-{seed}")
                runs[arm].append(result)
                print(f"{arm} seed={seed}: accuracy {result['final_accuracy']:.3f} in {result['wall_s']:.1f} s, "
                      f"train step {1000 * result['train_step_s_median']:.1f} ms, scoring "
                      f"{result['scoring_s_total']:.2f} s", file=sys.stderr, flush=True)
    budget = min(r["samples"] for results in runs.values() for r in results)
    horizon = min(r["wall_s"] for results in runs.values() for r in results)
    arms = {}
    for arm, results in runs.items():
        final, final_sd = mean_sd([r["final_accuracy"] for r in results])
        arms[arm] = {
            "overrides": ARMS[arm],
            "final_accuracy_mean": final, "final_accuracy_stdev": final_sd,
            "final_accuracies": [r["final_accuracy"] for r in results],
            "accuracy_at_equal_samples_mean": mean_sd([accuracy_at(r["curve"], "samples", budget) for r in results])[0],
            "accuracy_at_equal_wall_mean": mean_sd([accuracy_at(r["curve"], "wall_s", horizon) for r in results])[0],
            "wall_s_mean": statistics.mean(r["wall_s"] for r in results),
            "train_step_ms_median": 1000 * statistics.median(r["train_step_s_median"] for r in results),
            "replica_scoring_s_mean": statistics.mean(r["scoring_s_total"] for r in results),
            "replica_scoring_ms_per_batch": 1000 * statistics.mean(r["scoring_s_per_batch"] for r in results),
            "episodes_scored_mean": statistics.mean(r["episodes_scored"] for r in results),
            "utility_abs_mean": statistics.mean(r["utility_abs_mean"] for r in results),
        }
    base, process = arms["outcome_only"], arms["process_rewards"]
    result = {
        "steps": args.steps, "seeds": args.seeds, "first_accuracy": runs["outcome_only"][0]["curve"][0]["accuracy"],
        "arms": arms,
        "train_step_ratio": process["train_step_ms_median"] / base["train_step_ms_median"],
        "replica_scoring_share_of_wall": process["replica_scoring_s_mean"] / process["wall_s_mean"],
        "accuracy_points_at_equal_samples": 100 * (process["accuracy_at_equal_samples_mean"]
                                                   - base["accuracy_at_equal_samples_mean"]),
        "curves": {arm: [r["curve"] for r in results] for arm, results in runs.items()},
    }
    emit("process_rewards", result, {arm: arms[arm]["train_step_ms_median"] for arm in ARMS},
         "median learner train step (ms)",
         f"process rewards: learner step x{result['train_step_ratio']:.2f}, "
         f"{result['accuracy_points_at_equal_samples']:+.1f} points")


if __name__ == "__main__":
    main()
