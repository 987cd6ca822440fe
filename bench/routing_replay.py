"""Routing replay on the tiny MoE demo: R3, R2 and GSPO beside no replay, one sitting, same config and seed.

Each variant is a full `asyncrl up --config examples/tiny-moe.yaml` run (torch engines, eta = 2, two
mini-batches per step) of `--steps` learner steps (`r3_measured`: `--paired-steps`, since its per-step paired
difference is small and noisy); the figures are means over the steps after the first 5, read from the run's
learner event log:

- `delta_abs`: mean |logp_prox - logp_behav| per response token (`rc/delta_abs_mean`), the rollout/training
  mismatch the corrections must absorb; `delta_abs_unreplayed`: the same batches without replay (r3_measured
  runs the extra forward) and `paired`: replayed vs unreplayed step by step (runs diverge, so only the paired
  comparison isolates routing; across runs the policy drift dominates); `mismatch_frac`: tokens whose learner
  routing differs from the rollout's.
- `clip_frac` / `ratio_max`: the PPO ratio pi_theta / pi_prox over the mini-batches (what R2 steadies).
- cost: `routing/bytes_per_token` on the wire, and the learner step time of r3 (without the measuring forward)
  over none, as a ratio measured in the same sitting.

    .venv/bin/python bench/routing_replay.py [--steps 100] [--paired-steps 400]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import emit

ROOT = Path(__file__).resolve().parents[1]
GSPO = "{preset: decoupled_seq_is, policy_loss: {type: gspo, clip_eps_low: 3.0e-4, clip_eps_high: 4.0e-4}}"
VARIANTS = {
    "none": ["learner.routing_replay.mode=none"],
    "r3": ["learner.routing_replay.mode=r3", "learner.routing_replay.measure_unreplayed=false"],
    "r3_measured": ["learner.routing_replay.mode=r3", "learner.routing_replay.measure_unreplayed=true"],
    "r2": ["learner.routing_replay.mode=r2"],
    "gspo": ["learner.routing_replay.mode=none", f"learner.algo={GSPO}"],
}
SKIP_STEPS = 5


def run_variant(name: str, overrides: list[str], steps: int, runs: Path) -> dict:
    run_dir = runs / name
    command = [str(ROOT / ".venv/bin/asyncrl"), "up", "--config", str(ROOT / "examples/tiny-moe.yaml"),
               "--set", f"run_dir={run_dir}", "--set", f"learner.total_steps={steps}",
               "--set", f"learner.eval_every={steps}"]
    for item in overrides:
        command += ["--set", item]
    print(f"[bench] {name}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    events = [json.loads(line) for line in (run_dir / "events/learner.jsonl").read_text().splitlines()]
    trained = [e for e in events if e["kind"] == "step"][SKIP_STEPS:]
    evals = [e["accuracy"] for e in events if e["kind"] == "eval"]

    def mean(key: str) -> float | None:
        values = [e[key] for e in trained if key in e]
        return statistics.fmean(values) if values else None

    pairs = [(e["rc/delta_abs_mean"], e["routing/delta_abs_unreplayed"]) for e in trained
             if "routing/delta_abs_unreplayed" in e]
    return {
        "delta_abs": mean("rc/delta_abs_mean"),
        "delta_abs_unreplayed": mean("routing/delta_abs_unreplayed"),
        "mismatch_frac": mean("routing/mismatch_frac"),
        "mismatch_frac_per_layer": [mean(f"routing/mismatch_frac/layer{i}") for i in range(2)],
        "clip_frac": mean("loss/clip_frac"),
        "ratio_max": mean("loss/ratio_max"),
        "bytes_per_token": mean("routing/bytes_per_token"),
        "step_s_median": statistics.median(e["time/step_s"] for e in trained),
        "accuracy_start": evals[0],
        "accuracy_end": evals[-1],
        "steps": len(trained) + SKIP_STEPS,
        "paired": paired(pairs) if pairs else None,
    }


def paired(pairs: list[tuple[float, float]]) -> dict:
    """Replayed vs unreplayed |delta| on the same batches: how often replay lowered it, by how much."""
    diffs = [unreplayed - replayed for replayed, unreplayed in pairs]
    mean = statistics.fmean(diffs)
    stderr = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
    return {"steps": len(diffs), "steps_lowered": sum(d > 0 for d in diffs), "mean_reduction": mean,
            "reduction_stderr": stderr, "t_stat": mean / stderr if stderr else float("inf")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--paired-steps", type=int, default=400)
    args = parser.parse_args()
    if min(args.steps, args.paired_steps) <= SKIP_STEPS:
        parser.error(f"--steps and --paired-steps must exceed the {SKIP_STEPS} warm-up steps each run leaves out")
    with tempfile.TemporaryDirectory(prefix="bench-routing-") as tmp:
        results = {
            name: run_variant(name, overrides, args.paired_steps if name == "r3_measured" else args.steps, Path(tmp))
            for name, overrides in VARIANTS.items()
        }
    none, r3, measured = results["none"], results["r3"], results["r3_measured"]
    if measured["paired"] is None:
        raise SystemExit("the r3_measured run logged no routing/delta_abs_unreplayed")
    result = {
        "bench": "routing_replay",
        "command": f".venv/bin/python bench/routing_replay.py --steps {args.steps} --paired-steps {args.paired_steps}",
        "config": "examples/tiny-moe.yaml (Qwen3-MoE, 2 layers x 8 experts, top-2; eta 2; 2 mini-batches)",
        "variants": results,
        # Separate runs diverge (sampling, then the policy), so their delta_abs differ by more than routing
        # explains; the replay effect is the paired ratio on the same batches.
        "ratios": {
            "delta_abs_replayed_over_unreplayed_same_batches": measured["delta_abs"] / measured["delta_abs_unreplayed"],
            "step_time_r3_over_none": r3["step_s_median"] / none["step_s_median"],
        },
    }
    emit("routing_replay", result, *chart(result))


def chart(result: dict) -> tuple[dict, str, str]:
    """The paired comparison (the only one that isolates routing): the same batches without and with R3."""
    measured = result["variants"]["r3_measured"]
    bars = {"no replay": measured["delta_abs_unreplayed"], "R3": measured["delta_abs"]}
    title = (f"same batches, {measured['paired']['steps']} steps: R3 / none = "
             f"{result['ratios']['delta_abs_replayed_over_unreplayed_same_batches']:.3f}")
    return bars, "mean |logp_prox - logp_behav|", title


if __name__ == "__main__":
    main()
