"""Staleness at training against the bound η: the demo with the learner training groups in the order they
were written (`learner.oldest_first=false`, the baseline) and oldest first (the default), at η = 2 and η = 4,
runs alternating, one sitting.

The controller enforces η when it grants leases; what the learner trains can still be older when a group
reaches it late. Per run, from the learner's step events: the share of trained trajectories whose staleness
(learner version minus the version of their oldest token) exceeds η, the largest staleness, the histogram,
the wall time per learner step (median after 10 warm-up steps) and the held-out accuracy at the end.

    .venv/bin/python bench/consumption_staleness.py [--steps 600] [--trials 2] [--etas 2 4]
    (or: asyncrl bench consumption_staleness)
"""

from __future__ import annotations

import argparse
import collections
import itertools
import statistics
import tempfile
from pathlib import Path

from common import emit
from demo_runs import run_demo

WARMUP = 10
ORDERS = {"written": "false", "oldest_first": "true"}


def run(eta: int, order: str, steps: int, run_dir: Path) -> dict:
    events = run_demo(run_dir, [f"controller.eta={eta}", f"learner.total_steps={steps}", "learner.eval_every=0",
                                f"learner.oldest_first={ORDERS[order]}"])
    steps_ev = [e for e in events if e["kind"] == "step"]
    hist: collections.Counter = collections.Counter()
    for e in steps_ev:
        hist.update({int(k): v for k, v in e["staleness/hist"].items()})
    total = sum(hist.values())
    over = sum(v for k, v in hist.items() if k > eta)
    walls = [b["t"] - a["t"] for a, b in itertools.pairwise(steps_ev[WARMUP:])]
    evals = [e["accuracy"] for e in events if e["kind"] == "eval"]
    return {"over_eta_frac": over / total, "max_staleness": max(hist), "hist": dict(sorted(hist.items())),
            "wall_per_step_s": statistics.median(walls), "eval_last": evals[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--etas", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    runs: dict[str, list[dict]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        for trial, eta, order in itertools.product(range(args.trials), args.etas, ORDERS):
            runs[f"eta{eta}_{order}"].append(run(eta, order, args.steps, Path(tmp) / f"{trial}-{eta}-{order}"))
    result = {"steps": args.steps, "trials": args.trials, "runs": runs}
    for key, cells in runs.items():
        result[f"{key}_over_eta_pct"] = 100 * statistics.mean(c["over_eta_frac"] for c in cells)
        result[f"{key}_max_staleness"] = max(c["max_staleness"] for c in cells)
        result[f"{key}_wall_per_step_ms"] = 1e3 * statistics.median(c["wall_per_step_s"] for c in cells)
    emit("consumption_staleness", result, {key.replace("_", " "): result[f"{key}_over_eta_pct"] for key in runs},
         "% of trained trajectories older than η",
         "staleness at training: written order vs oldest first")


if __name__ == "__main__":
    main()
