"""Training-free process rewards against the outcome reward alone, same steps, several seeds, one sitting;
distillation off in both arms (its per-token signal would blur the comparison). Two tasks (`--example`):

- the demo (tiny-arith): its responses are a few digits with no discourse markers, so its episodes come from
  the length fallback (two tokens each) and the force-answer prompt is "=": V(prefix) asks how likely the right
  sum is after the digits written so far. That is the shape of the mechanism, not the reasoning chains the
  seed post targets.
- the agent demo (tool-agent), the task made for it: three 4-digit terms added with an `add` tool over several
  turns. Each answered turn is an episode; V is scored after the tool's answer (the observation opens the
  model's next turn, so the force-answer prompt is empty): a call whose result holds the final sum makes the
  right answer likely, a wrong call does not, and the call gets the difference as its credit.

The costs are the real ones:

- the replica's time for V(prefix): the `process_rewards_scored` records (seconds per batch, episodes scored),
  against the run's wall time;
- the learner's step: the median train step (`time/step_s`) with and without, which must not grow (the
  utilities arrive with the groups; the learner only normalises and sums them).

Accuracy: held-out greedy accuracy at the end, and at the sample budget and wall time both arms reached.

    .venv/bin/python bench/process_rewards.py [--example tiny-arith|tool-agent] [--steps N] [--seeds 3]
    (or: asyncrl bench process_rewards); results in docs/results/process_rewards.json (the demo) and
    process_rewards-agent.json
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
    run_seeded,
)
from demo_runs import run_demo

EXAMPLES = {
    "tiny-arith": {"result": "process_rewards", "steps": 300, "eval_every": 50,
                   "process": ["rollout.process_rewards.enabled=true", "rollout.process_rewards.max_episode_tokens=2",
                               'rollout.process_rewards.force_answer="="']},
    "tool-agent": {"result": "process_rewards-agent", "steps": 200, "eval_every": 25,
                   "process": ["rollout.process_rewards.enabled=true", 'rollout.process_rewards.force_answer=""']},
}


def run(arm: str, seed: int, run_dir: Path, example: str, arms: dict, steps: int, every: int) -> dict:
    learner = run_demo(run_dir, [*WITHOUT_TEACHER, f"learner.total_steps={steps}", f"learner.eval_every={every}",
                                 f"seed={seed}", *arms[arm]], example=example)
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
    parser.add_argument("--example", choices=sorted(EXAMPLES), default="tiny-arith")
    parser.add_argument("--steps", type=int, default=None, help="learner steps (default: the example's)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--eval-every", type=int, default=None)
    args = parser.parse_args()
    example = EXAMPLES[args.example]
    steps, every = args.steps or example["steps"], args.eval_every or example["eval_every"]
    arms_overrides = {"outcome_only": [], "process_rewards": example["process"]}
    runs = run_seeded(arms_overrides, args.seeds, functools.partial(run, example=args.example, arms=arms_overrides,
                                                                    steps=steps, every=every), describe)
    _, _, figures = accuracy_figures(runs)
    arms = {}
    for arm, results in runs.items():
        arms[arm] = {
            "overrides": arms_overrides[arm], **figures[arm],
            "train_step_ms_median": 1000 * statistics.median(r["train_step_s_median"] for r in results),
            "replica_scoring_s_mean": statistics.mean(r["scoring_s_total"] for r in results),
            "replica_scoring_ms_per_batch": 1000 * statistics.mean(r["scoring_s_per_batch"] for r in results),
            "episodes_scored_mean": statistics.mean(r["episodes_scored"] for r in results),
            "utility_abs_mean": statistics.mean(r["utility_abs_mean"] for r in results),
            # Held-out accuracy averaged over every evaluation after the first: the whole curve, less noisy
            # than its last point.
            "accuracy_over_evaluations_mean": statistics.mean(
                statistics.mean(p["accuracy"] for p in r["curve"][1:]) for r in results),
        }
    base, process = arms["outcome_only"], arms["process_rewards"]
    result = {
        "example": args.example, "steps": steps, "seeds": args.seeds,
        "first_accuracy": runs["outcome_only"][0]["curve"][0]["accuracy"],
        "arms": arms,
        "train_step_ratio": process["train_step_ms_median"] / base["train_step_ms_median"],
        "replica_scoring_share_of_wall": process["replica_scoring_s_mean"] / process["wall_s_mean"],
        "accuracy_points_at_equal_samples": 100 * (process["accuracy_at_equal_samples_mean"]
                                                   - base["accuracy_at_equal_samples_mean"]),
        "curves": {arm: [r["curve"] for r in results] for arm, results in runs.items()},
    }
    emit(example["result"], result, {arm: arms[arm]["train_step_ms_median"] for arm in arms_overrides},
         "median learner train step (ms)",
         f"process rewards ({args.example}): learner step x{result['train_step_ratio']:.2f}, "
         f"{result['accuracy_points_at_equal_samples']:+.1f} points")


if __name__ == "__main__":
    main()
