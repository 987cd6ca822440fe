"""The real-model example with a far replica behind a thin link: sparse delta pushes against whole ones, in one
sitting (root: network namespaces, `asyncrl.tools.lab_run`).

examples/smollm2-arithmetic.yaml in bfloat16 (float32 master weights, a bfloat16 wire) with two torch
replicas, every service on a host of its own, every link capped at `--mbit` both ways and replica 1's at
`--far-mbit`. Arms:
  deltas : `learner.weight_transport.sparse_deltas=true`, `--steps` steps;
  whole  : every push whole (the baseline), `--whole-steps` steps (each push waits for the far replica).
Reported per arm: learner steps per second, each push's bytes and time (the learner's Begin to Commit),
the time the far link needs for those bytes (the bound), and per replica the groups trained and the groups
dropped as too stale, with the audit.

    sudo .venv/bin/python bench/network_deltas.py [--steps 20] [--whole-steps 4] [--mbit 200] [--far-mbit 50]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
from pathlib import Path

from common import emit
from network_run import groups_by_replica, run_in_lab

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "smollm2-arithmetic.yaml"
REPLICAS = 2


def overrides(steps: int, sparse: bool) -> list[str]:
    return [f"rollout.replicas={REPLICAS}", f"learner.total_steps={steps}", "learner.eval_every=0",
            "model.dtype=bfloat16", f"learner.weight_transport.sparse_deltas={str(sparse).lower()}"]


def figures(run_dir: Path, far_mbit: float) -> dict:
    from asyncrl.core.records.learner import Step, WeightsPushed
    from asyncrl.core.runtime.events import read_records
    from asyncrl.tools.audit import audit_run

    learner = read_records(run_dir, "learner")
    steps = [ev for ev in learner if isinstance(ev, Step)]
    pushes = [ev for ev in learner if isinstance(ev, WeightsPushed)]
    trained, stale = groups_by_replica(learner)
    # The first pushes carry Adam's first, full-size steps; from the third on, the steady state.
    steady = pushes[2:] or pushes
    audit = audit_run(str(run_dir))
    return {
        "steps_per_s": (len(steps) - 1) / (steps[-1].t - steps[0].t),
        "step_s_median": statistics.median(b.t - a.t for a, b in itertools.pairwise(steps)),
        "pushes": [{"version": p.version, "bytes": p.push_bytes, "push_s": round(p.push_s, 3)} for p in pushes],
        "steady_push_bytes_median": statistics.median(p.push_bytes for p in steady),
        "steady_push_s_median": statistics.median(p.push_s for p in steady),
        "steady_far_link_bound_s": statistics.median(p.push_bytes for p in steady) * 8 / (far_mbit * 1e6),
        "staleness_mean": statistics.mean(ev.metrics["staleness/mean"] for ev in steps),
        "trained_groups": dict(sorted(trained.items())),
        "stale_groups": dict(sorted(stale.items())),
        "audit_ok": audit.ok,
        "audit": audit.headline(),
    }


def lab_arm(steps: int, sparse: bool, args, root: Path) -> dict:
    run_in_lab(EXAMPLE, root, tuple(overrides(steps, sparse)), args.mbit, args.far_mbit)
    return figures(root, args.far_mbit)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--whole-steps", type=int, default=4)
    parser.add_argument("--mbit", type=float, default=200.0)
    parser.add_argument("--far-mbit", type=float, default=50.0)
    args = parser.parse_args()
    arms: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, steps, sparse in (("deltas", args.steps, True), ("whole", args.whole_steps, False)):
            arms[name] = lab_arm(steps, sparse, args, Path(tmp) / name)
            print(name, {k: v for k, v in arms[name].items() if k != "pushes"}, flush=True)
    deltas, whole = arms["deltas"], arms["whole"]
    result = {"mbit": args.mbit, "far_mbit": args.far_mbit, "arms": arms,
              "steps_per_s_deltas_over_whole": deltas["steps_per_s"] / whole["steps_per_s"],
              "push_bytes_deltas_over_whole": deltas["steady_push_bytes_median"] / whole["steady_push_bytes_median"]}
    emit("network_deltas", result, {name: arm["steps_per_s"] for name, arm in arms.items()}, "learner steps / s",
         f"SmolLM2-135M in bfloat16, 2 replicas, links at {args.mbit:.0f} Mb/s, one at {args.far_mbit:.0f} Mb/s: "
         f"sparse delta pushes against whole ones")


if __name__ == "__main__":
    main()
