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
import functools
import statistics
from pathlib import Path

from common import (
    WITHOUT_TEACHER,
    accuracy_curve,
    accuracy_figures,
    emit,
    rollout_events,
    run_demo,
    run_seeded,
)

ARMS = {
    "outcome_only": [],
    "process_rewards": ["rollout.process_rewards.enabled=true", "rollout.process_rewards.max_episode_tokens=2",
                        'rollout.process_rewards.force_answer="="'],
}


def run(arm: str, seed: int, run_dir: Path, steps: int, every: int) -> dict:
    learner = run_demo(run_dir, [*WITHOUT_TEACHER, f"learner.total_steps={steps}", f"learner.eval_every={every}",
                                 f"seed={seed}", *ARMS[arm]])
    scored = [e for e in rollout_events(run_dir) if e["kind"] == "process_rewards_scored"]
    steps_ev = [e for e in learner if e["kind"] == "step"]
    return {
        "curve": accuracy_curve(run_dir, learner, ("group_written",)),
        "train_step_s_median": statistics.median(e["time/step_s"] for e in steps_ev),
        "scoring_s_total": sum(e["seconds"] for e in scored),
        "scoring_s_per_batch": statistics.mean(e["seconds"] for e in scored) if scored else 0.0,
        "episodes_scored": sum(e["episodes"] for e in scored),
        "utility_abs_mean": statistics.mean(e.get("process/utility_abs_mean", 0.0) for e in steps_ev),
    }


def describe(result: dict) -> str:
    end = result["curve"][-1]
    return (f"accuracy {end['accuracy']:.3f} in {end['wall_s']:.1f} s, train step "
            f"{1000 * result['train_step_s_median']:.1f} ms, scoring {result['scoring_s_total']:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--eval-every", type=int, default=50)
    args = parser.parse_args()
    runs = run_seeded(ARMS, args.seeds, functools.partial(run, steps=args.steps, every=args.eval_every), describe)
    _, _, figures = accuracy_figures(runs)
    arms = {}
    for arm, results in runs.items():
        arms[arm] = {
            "overrides": ARMS[arm], **figures[arm],
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
