"""What it costs the learner's shared base to move from one run's adapter to another's (`learner/runs.py`).

K runs' adapters (rank 16 on every attention and MLP projection, peft) on one base of the shape chosen, random
weights, one thread. Per call of a run's work, in milliseconds (median of `--repeats` rounds of K calls):
  there_and_back : `run_active`, the run's adapter activated for the call and the one before restored after it
                   (two passes over every LoRA layer, and a module walk to find them);
  switch         : `SharedBase`: the LoRA layers kept, one pass when the next call is another run's;
  same_run       : `SharedBase`, the next call the same run's: nothing to switch.

    .venv/bin/python bench/adapter_switch.py [--runs 4] [--shapes demo smollm2] [--repeats 10]
    (or: asyncrl bench adapter_switch)
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch
from common import emit
from mixed_adapters import SHAPES, TARGETS, random_model

from asyncrl.learner.adapters import inject_adapters, run_active
from asyncrl.learner.runs import SharedBase


def per_call_ms(calls, repeats: int) -> float:
    """Median over `repeats` rounds of the mean milliseconds per call of `calls` (a list of no-argument calls)."""
    rounds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for call in calls:
            call()
        rounds.append((time.perf_counter() - start) / len(calls) * 1e3)
    return statistics.median(rounds)


def time_shape(shape: dict, runs: int, repeats: int) -> dict:
    model = random_model(shape)
    lora = SimpleNamespace(rank=16, alpha=32.0, dropout=0.0, target_modules=list(TARGETS))
    names = [f"run-{i}" for i in range(runs)]
    for name in names:
        inject_adapters(model, lora, name)
    base = SharedBase(model, threads=1)

    def noop():
        return None

    def in_context(name):
        with run_active(model, name):
            pass

    figures = {
        "there_and_back_ms": per_call_ms([lambda n=n: in_context(n) for n in names], repeats),
        "switch_ms": per_call_ms([lambda n=n: base.run(n, noop) for n in names], repeats),
        "same_run_ms": per_call_ms([lambda: base.run(names[0], noop)] * runs, repeats),
    }
    return {key: round(value, 2) for key, value in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {name: time_shape(SHAPES[name], args.runs, args.repeats) for name in args.shapes}
    emit("adapter_switch", {"runs": args.runs, "rank": 16, "targets": list(TARGETS), **results},
         {f"{name}: {arm}": results[name][f"{arm}_ms"] for name in results
          for arm in ("there_and_back", "switch", "same_run")},
         "ms per call", f"moving the shared base between {args.runs} runs' adapters, per call of a run's work")


if __name__ == "__main__":
    main()
