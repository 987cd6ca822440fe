"""What bounds asyncrl's learner step on this machine: a demo run at η = 2 (teacher off, as the peer comparison
runs it) with every process's CPU time sampled from /proc, per arm of `--set` overrides, in one sitting.

Per arm: the wall time per learner step between the first and the last step, each role's CPU milliseconds per
step (learner, the replicas together, controller, Redis, `up`), how many cores the run kept busy, and the
learner's busy share (its CPU per step over the step: 1.0 means the learner computed for the whole step, so
nothing else in the run can make the step shorter; only a cheaper or better-parallelised learner can). The
baseline arm is the demo's own settings (one torch thread per process); `--arms` adds others, e.g. the
learner on two threads.

    .venv/bin/python bench/step_bound.py [--size demo|30m] [--steps 40] [--arms "learner.threads=2"]
    results: docs/results/step_bound[-30m].json
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import WITHOUT_TEACHER, emit
from demo_runs import cpu_ms_per_step, run_demo
from peers import SIZES, timings

BASELINE = "demo settings"


def run_arm(overrides: list[str], steps: int, size: str) -> dict:
    samples: list = []
    with tempfile.TemporaryDirectory(prefix="asyncrl-step-bound-") as tmp:
        t0 = time.time()
        learner = run_demo(Path(tmp) / "run", ["seed=1", f"learner.total_steps={steps}", "learner.eval_every=0",
                                               "controller.eta=2", f"learner.checkpoint.save_every={steps}",
                                               *WITHOUT_TEACHER, *SIZES[size]["overrides"], *overrides],
                           cpu_samples=samples)  # fmt: skip
    ends = [e["t"] for e in learner if e["kind"] == "step"]
    timed = timings(t0, ends, time.time(), samples)
    by_role = cpu_ms_per_step(samples, ends[0], ends[-1], max(1, len(ends) - 1))
    per_step_ms = timed["per_step_ms"]
    return {"per_step_ms": round(per_step_ms, 1), "first_step_s": round(timed["first_step_s"], 1),
            "cpu_ms_per_step": by_role, "cores_busy": round(timed["cores_busy"], 2),
            "learner_busy": round(by_role.get("learner", 0.0) / per_step_ms, 2),
            "replicas_cpu_ms_per_step": by_role.get("rollout", 0.0)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=sorted(SIZES), default="demo")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--arms", default="learner.threads=2",
                        help="';'-separated arms, each a ','-separated list of KEY=VALUE overrides")
    args = parser.parse_args()
    arms = {BASELINE: [], **{arm: arm.split(",") for arm in args.arms.split(";") if arm}}
    results = {}
    for name, overrides in arms.items():
        results[name] = run_arm(overrides, args.steps, args.size)
        print(name, results[name], flush=True)
    base = results[BASELINE]["per_step_ms"]
    result = {"size": args.size, "steps": args.steps, "eta": 2, "arms": results,
              "per_step_vs_baseline": {name: round(r["per_step_ms"] / base, 3) for name, r in results.items()}}
    emit("step_bound" + ("" if args.size == "demo" else f"-{args.size}"), result,
         {name: r["per_step_ms"] for name, r in results.items()}, "ms per learner step",
         f"learner step at η = 2, {args.size} model")


if __name__ == "__main__":
    main()
