"""The AReaL staleness ablation in miniature: held-out accuracy of the demo for η in {0, 1, 2, 4, 8, unbounded}
x {naive PPO, decoupled PPO}, equal sample budgets, several seeds, one sitting.

- naive PPO: the PPO ratio is taken against the behaviour policy that generated the tokens (preset
  `bypass_ppo_clip`: π_prox := π_behav), so stale samples pull the update towards old policies;
- decoupled PPO: the ratio is taken against the proximal policy (the learner's weights before the step),
  with a truncated token IS weight π_prox / π_behav for the staleness (preset `decoupled_token_is`).

Every run is `asyncrl up` on examples/tiny-arith.yaml (torch engines, teacher on) with `--steps` learner steps
(the same number of trajectories for every cell) and a greedy held-out evaluation every `--eval-every` steps.
Reported per cell: the mean and spread over seeds of the final accuracy, and the curves of accuracy against
trajectories consumed and against wall time (docs/results/staleness_ablation-curves.png).

    .venv/bin/python bench/staleness_ablation.py [--steps 100] [--seeds 3] [--eval-every 25]
    (or: asyncrl bench staleness_ablation)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from common import RESULTS, emit
from demo_runs import run_demo

ETAS = ["0", "1", "2", "4", "8", "null"]
ALGOS = {"naive": "bypass_ppo_clip", "decoupled": "decoupled_token_is"}


def run(eta: str, preset: str, seed: int, steps: int, eval_every: int, run_dir: Path) -> dict:
    events = run_demo(run_dir, [f"controller.eta={eta}", f"learner.total_steps={steps}",
                                f"learner.eval_every={eval_every}", f"learner.algo.preset={preset}", f"seed={seed}"])
    steps_ev = [e for e in events if e["kind"] == "step"]
    start = steps_ev[0]["t"] - steps_ev[0]["time/step_s"]
    batch = steps_ev[0]["batch/sequences"]
    evals = [e for e in events if e["kind"] == "eval"]
    return {
        "final_accuracy": evals[-1]["accuracy"],
        "curve": [{"trajectories": e["step"] * batch, "wall_s": max(0.0, e["t"] - start), "accuracy": e["accuracy"]}
                  for e in evals],
        "wall_s": steps_ev[-1]["t"] - start,
        "staleness_mean": statistics.mean(e["staleness/mean"] for e in steps_ev),
    }


def plot(cells: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharey=True)
    colors = dict(zip(ETAS, ["black", "tab:blue", "tab:green", "tab:orange", "tab:red", "tab:purple"]))
    for row, algo in enumerate(ALGOS):
        for eta in ETAS:
            runs = cells[algo][eta]["runs"]
            points = len(runs[0]["curve"])
            mean = [statistics.mean(r["curve"][i]["accuracy"] for r in runs) for i in range(points)]
            samples = [runs[0]["curve"][i]["trajectories"] for i in range(points)]
            wall = [statistics.mean(r["curve"][i]["wall_s"] for r in runs) for i in range(points)]
            label = "η=∞" if eta == "null" else f"η={eta}"
            axes[row][0].plot(samples, mean, "o-", color=colors[eta], label=label, markersize=3)
            axes[row][1].plot(wall, mean, "o-", color=colors[eta], label=label, markersize=3)
        axes[row][0].set_ylabel(f"{algo} PPO: held-out accuracy")
        axes[row][0].legend(fontsize=8)
    axes[1][0].set_xlabel("trajectories consumed")
    axes[1][1].set_xlabel("wall time (s)")
    fig.suptitle("staleness ablation (mean over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--eval-every", type=int, default=25)
    args = parser.parse_args()
    cells: dict = {algo: {} for algo in ALGOS}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            for algo, preset in ALGOS.items():
                for eta in ETAS:
                    result = run(eta, preset, seed, args.steps, args.eval_every,
                                 Path(tmp) / f"{algo}-eta{eta}-seed{seed}")
                    cells[algo].setdefault(eta, {"runs": []})["runs"].append(result)
                    print(f"{algo} eta={eta} seed={seed}: accuracy {result['final_accuracy']:.3f} "
                          f"in {result['wall_s']:.0f} s", file=sys.stderr, flush=True)
    table = {}
    for algo in ALGOS:
        for eta in ETAS:
            finals = [r["final_accuracy"] for r in cells[algo][eta]["runs"]]
            cell = cells[algo][eta]
            cell["final_accuracy_mean"] = statistics.mean(finals)
            cell["final_accuracy_stdev"] = statistics.stdev(finals) if len(finals) > 1 else 0.0
            cell["wall_s_mean"] = statistics.mean(r["wall_s"] for r in cell["runs"])
            table[f"{algo} η={'∞' if eta == 'null' else eta}"] = cell["final_accuracy_mean"]
    sync = cells["decoupled"]["0"]["final_accuracy_mean"]
    result = {
        "steps": args.steps, "seeds": args.seeds, "eval_every": args.eval_every,
        "first_accuracy": cells["decoupled"]["0"]["runs"][0]["curve"][0]["accuracy"],
        "final_accuracy": table,
        "decoupled_eta4_minus_sync_points": 100 * (cells["decoupled"]["4"]["final_accuracy_mean"] - sync),
        "naive_eta4_minus_sync_points": 100 * (cells["naive"]["4"]["final_accuracy_mean"] - sync),
        "cells": {algo: {eta: {k: v for k, v in cell.items() if k != "runs"} | {
            "final_accuracies": [r["final_accuracy"] for r in cell["runs"]],
            "staleness_mean": statistics.mean(r["staleness_mean"] for r in cell["runs"])}
            for eta, cell in by_eta.items()} for algo, by_eta in cells.items()},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(cells, RESULTS / "staleness_ablation-curves.png")
    emit("staleness_ablation", result, table, "final held-out accuracy (mean over seeds)",
         f"{args.steps} steps x {args.seeds} seeds; curves: staleness_ablation-curves.png")


if __name__ == "__main__":
    main()
