"""Does a LoRA run learn as full fine-tuning does? The demo (tiny-arith) and the word-problems example, each
trained with full weights and with LoRA (`learner.lora`, rank 16 on every linear module) for the example's own
number of steps, so at equal samples (the same batches of the same size), over several seeds, one sitting.

Reported per example and mode: the held-out greedy accuracy at the start and after the last step (mean and
sample standard deviation over the seeds, each seed's figure), the gap LoRA - full, and the bytes each push
carried. LoRA's learning rate is its own (`--lora-lr`; full runs keep the example's): adapters start at B = 0
and need a larger step to move the policy as far; too large a one loses accuracy and then collapses the tiny
policy (single runs of the demo at rank 16: 5e-4 0.500, 1e-3 0.500, 2e-3 0.445, 4e-3 0.000; rank 64 at 1e-3
0.200, against 0.520-0.555 at 2e-4).

    .venv/bin/python bench/lora_learning.py [--seeds 3] [--lora-lr 2e-4] [--examples tiny-arith word-problems]
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from common import emit, mean_sd, run_seeded
from demo_runs import run_demo


def run(mode: str, seed: int, run_dir: Path, example: str, overrides: dict[str, list[str]]) -> dict:
    learner = run_demo(run_dir, [f"seed={seed}", *overrides[mode]], example=example)
    evals = [e for e in learner if e["kind"] == "eval"]
    return {"start": evals[0]["accuracy"], "final": evals[-1]["accuracy"],
            "push_bytes": max(e["push_bytes"] for e in learner if e["kind"] == "push")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--lora-lr", type=float, default=2e-4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--examples", nargs="+", default=["tiny-arith", "word-problems"])
    args = parser.parse_args()
    overrides = {"full": [], "lora": ["learner.lora.enabled=true", f"learner.lr={args.lora_lr}",
                                      f"learner.lora.rank={args.rank}", f"learner.lora.alpha={2 * args.rank}"]}
    results: dict[str, dict] = {}
    for example in args.examples:
        runs = run_seeded(overrides, args.seeds, functools.partial(run, example=example, overrides=overrides),
                          lambda r: f"accuracy {r['start']:.3f} -> {r['final']:.3f}")
        results[example] = {}
        for mode, done in runs.items():
            finals = [r["final"] for r in done]
            mean, sd = mean_sd(finals)
            results[example][mode] = {"start": round(done[0]["start"], 4), "final_mean": round(mean, 4),
                                      "final_sd": round(sd, 4), "finals": finals, "push_bytes": done[0]["push_bytes"]}
        full, lora = results[example]["full"], results[example]["lora"]
        results[example]["lora_minus_full_points"] = round(100 * (lora["final_mean"] - full["final_mean"]), 1)
        results[example]["push_bytes_ratio"] = round(full["push_bytes"] / lora["push_bytes"], 1)
    emit("lora_learning", {"seeds": args.seeds, "lora": {"rank": args.rank, "alpha": 2 * args.rank,
                                                         "lr": args.lora_lr}, "examples": results},
         {f"{example}: {mode}": results[example][mode]["final_mean"]
          for example in args.examples for mode in ("full", "lora")},
         "held-out greedy accuracy", f"LoRA r{args.rank} vs full fine-tuning, final accuracy, {args.seeds} seeds")


if __name__ == "__main__":
    main()
