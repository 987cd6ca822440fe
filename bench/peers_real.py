"""asyncrl against Hugging Face TRL's `GRPOTrainer` on a real model: SmolLM2-135M-Instruct on reasoning-gym's
basic_arithmetic (examples/smollm2-arithmetic.yaml), settings matched, same sitting.

Both train the converted checkpoint on the example's training prompts in the same order (4 prompts a step,
G = 8, 32 samples), the same reward (the answer in <answer> tags, else the last number, scored as reasoning-gym
scores it), lr 3e-6 constant, clip 0.2, no KL, a token-mean loss, gradient clipping at 1.0, temperature 1,
at most 24 new tokens, float32 (`--dtype bfloat16`: asyncrl with `model.dtype: bfloat16`, TRL with its `bf16`
autocast; both keep float32 master weights). asyncrl runs the example as a user does (one torch replica,
η = 2, the learner evaluating every 10 steps in line). TRL (`bench/peers.py`'s virtual environment) generates with the
model it trains, in one process; its policy is saved every 10 steps (the save time is taken off its clock)
and evaluated afterwards by the same evaluation: asyncrl's torch engine, greedy, the example's 100 held-out
prompts.

Per arm and seed: the wall seconds per learner step (median), the whole run, the held-out accuracy curve (every
10 steps, against the seconds since the command started and the samples trained), and the seconds to reach
`--target` held-out accuracy, start-up and evaluations included in both arms: asyncrl's evaluations run in
line on the learner's thread (the replica keeps generating meanwhile); TRL's would stop its one process, so
each of its evaluations (the base model's included, as asyncrl's step-0 one) adds the seconds it took here,
on TRL's two threads. `time_to_target_speedup_vs_trl_without_its_evaluations` leaves TRL's off its clock
(the stricter figure). The model was converted before, for both.

    .venv/bin/python bench/peers_real.py [--seeds 1] [--steps 30] [--target 0.5] [--dtype bfloat16]
    (or: asyncrl bench peers_real)
    results: docs/results/peers-real.json and .png (bfloat16: peers-real-bfloat16.*)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import RESULTS, emit
from demo_runs import run_demo
from peers import peer_python, run_peer
from real_model import EXAMPLE, draw_curves, fetch_model

REPO = Path(__file__).resolve().parents[1]
EVAL_EVERY = 10
SAMPLES_PER_STEP = 32
"""The example's learner.batch_size."""


def example_config(seed: int = 0):
    from asyncrl.core.config.file import load_config

    return load_config(REPO / "examples" / f"{EXAMPLE}.yaml", [f"seed={seed}"])


def held_out_accuracy(model_dir: Path, config, task, dtype: str = "float32") -> tuple[float, float]:
    """(greedy held-out accuracy, the seconds the evaluation took, loading the model included)."""
    from asyncrl.core.config.schema import EngineConfig
    from asyncrl.core.engines.torch_engine import TorchEngine
    from asyncrl.core.tasks.evaluate import greedy_accuracy

    start = time.perf_counter()
    engine = TorchEngine(EngineConfig(threads=2, max_model_len=config.rollout.engine.max_model_len), str(model_dir),
                         dtype=dtype)
    try:
        return greedy_accuracy(engine, task, max_new_tokens=config.sampling.max_new_tokens), time.perf_counter() - start
    finally:
        engine.close()


def time_to(curve: list[dict], target: float, clock: str = "since_start_s") -> float | None:
    """Seconds since the start (`clock`: one of the curve's clocks) at the first evaluation at or above `target`
    (None: never)."""
    return next((p[clock] for p in curve if p["accuracy"] >= target), None)


def run_asyncrl(run_dir: Path, seed: int, steps: int, dtype: str) -> dict:
    t0 = time.time()
    learner = run_demo(run_dir, [f"seed={seed}", f"learner.total_steps={steps}", f"learner.eval_every={EVAL_EVERY}",
                                 f"model.dtype={dtype}"], example=EXAMPLE)
    exited = time.time()
    step_events = [e for e in learner if e["kind"] == "step"]
    curve = [{"step": e["step"], "accuracy": e["accuracy"], "since_start_s": e["t"] - t0,
              "with_evaluations_s": e["t"] - t0, "samples": SAMPLES_PER_STEP * e["step"]}
             for e in learner if e["kind"] == "eval"]  # its evaluations are in its clock already
    return {"per_step_s": statistics.median(e["time/wall_s"] for e in step_events[1:]), "run_s": exited - t0,
            "curve": curve}


def run_trl(out: Path, seed: int, steps: int, data: Path, config, task, base: tuple[float, float],
            dtype: str) -> dict:
    report, t0, exited, _ = run_peer(data, REPO / config.model.path, out, steps, seed)
    ends, saves = report["step_ends"], report["save_s"]
    # The saves every EVAL_EVERY steps are the bench's, not TRL's: their seconds come off every later time.

    def clock(step: int) -> float:
        return ends[step - 1] - t0 - sum(saves[: (step - 1) // EVAL_EVERY])

    base_accuracy, evaluations_s = base
    curve = [{"step": 0, "accuracy": base_accuracy, "since_start_s": 0.0, "with_evaluations_s": evaluations_s,
              "samples": 0}]
    for step in range(EVAL_EVERY, steps + 1, EVAL_EVERY):
        policy = out / ("final" if step == steps else f"step-{step}")
        accuracy, seconds = held_out_accuracy(policy, config, task, dtype)
        evaluations_s += seconds
        curve.append({"step": step, "accuracy": accuracy, "since_start_s": clock(step),
                      "with_evaluations_s": clock(step) + evaluations_s, "samples": SAMPLES_PER_STEP * step})
    per_step = statistics.median(b - a for a, b in itertools.pairwise(ends))
    return {"per_step_s": per_step, "run_s": exited - t0 - sum(saves), "curve": curve}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--target", type=float, default=0.5)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="both arms' forwards (float32 master weights either way)")
    args = parser.parse_args()
    os.chdir(REPO)
    fetch_model()
    peer_python()
    from asyncrl.core.tasks import task_for_run

    config = example_config()
    task = task_for_run(config)
    prompts = [task.train_prompt(i) for i in range(args.steps * 4)]
    base = held_out_accuracy(REPO / config.model.path, config, task, args.dtype)  # (accuracy, seconds)
    arms: dict[str, list[dict]] = {"asyncrl eta=2": [], "TRL GRPOTrainer": []}
    # A run's plot process may still write into its folder as the folder goes: what it cannot remove stays.
    with tempfile.TemporaryDirectory(prefix="asyncrl-peers-real-", ignore_cleanup_errors=True) as tmp:
        data = Path(tmp) / "prompts.json"
        data.write_text(json.dumps({"prompts": [p.text for p in prompts], "answers": [p.metadata["answer"] for p in prompts],
                                    "reward": "reasoning_gym", "lr": config.learner.lr,
                                    "batch_size": config.learner.batch_size, "group_size": config.sampling.group_size,
                                    "max_new_tokens": config.sampling.max_new_tokens,
                                    "temperature": config.sampling.temperature, "save_every": EVAL_EVERY,
                                    "bf16": args.dtype == "bfloat16"}))
        for seed in range(args.seeds):
            arms["asyncrl eta=2"].append(run_asyncrl(Path(tmp) / f"asyncrl-{seed}", seed, args.steps, args.dtype))
            print("asyncrl", seed, {k: v for k, v in arms["asyncrl eta=2"][-1].items()}, file=sys.stderr, flush=True)
            arms["TRL GRPOTrainer"].append(run_trl(Path(tmp) / f"trl-{seed}", seed, args.steps, data, config, task, base,
                                                    args.dtype))
            print("TRL", seed, arms["TRL GRPOTrainer"][-1], file=sys.stderr, flush=True)
    summary = {}
    for name, runs in arms.items():
        summary[name] = {"per_step_s": round(statistics.median(r["per_step_s"] for r in runs), 2),
                         "run_s": round(statistics.median(r["run_s"] for r in runs), 1),
                         "final_accuracy": [r["curve"][-1]["accuracy"] for r in runs], "runs": runs}
        for clock, key in (("with_evaluations_s", "time_to_target_s"),
                           ("since_start_s", "time_to_target_without_evaluations_s")):
            summary[name][key] = [None if t is None else round(t, 1)
                                  for t in (time_to(r["curve"], args.target, clock) for r in runs)]
    ours, trl = summary["asyncrl eta=2"], summary["TRL GRPOTrainer"]

    def speedup(trl_key: str) -> float | None:
        ours_t = [t for t in ours["time_to_target_s"] if t is not None]
        trl_t = [t for t in trl[trl_key] if t is not None]
        return round(statistics.median(trl_t) / statistics.median(ours_t), 2) if ours_t and trl_t else None

    result = {"model": "SmolLM2-135M-Instruct", "task": "reasoning-gym basic_arithmetic (2 terms, 1-2 digits, +)",
              "steps": args.steps, "seeds": args.seeds, "target_accuracy": args.target,
              "base_accuracy": base[0], "base_evaluation_s": round(base[1], 1), "dtype": args.dtype,
              "peer": f"trl==1.16.0 GRPOTrainer (CPU, 2 threads, {args.dtype})", "arms": summary,
              "per_step_speedup_vs_trl": round(trl["per_step_s"] / ours["per_step_s"], 2),
              "time_to_target_speedup_vs_trl": speedup("time_to_target_s"),
              "time_to_target_speedup_vs_trl_without_its_evaluations": speedup("time_to_target_without_evaluations_s")}
    name = "peers-real" + ("" if args.dtype == "float32" else f"-{args.dtype}")
    emit(name, result, {f"{name}: s per step": s["per_step_s"] for name, s in summary.items()}, "seconds",
         f"{args.steps} steps, SmolLM2-135M-Instruct, {args.dtype}, median of {args.seeds} seeds")
    draw_curves({f"{name}, seed {i}": [(p["with_evaluations_s"], p["accuracy"]) for p in run["curve"]]
                 for name, s in summary.items() for i, run in enumerate(s["runs"])},
                RESULTS / f"{name}-curve.png",
                f"SmolLM2-135M-Instruct ({args.dtype}), reasoning-gym basic_arithmetic, 2 CPU cores",
                "seconds since the command started, evaluations included", target=args.target)


if __name__ == "__main__":
    main()
