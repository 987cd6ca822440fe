"""Several LoRA runs on one base against the same runs one after another (`runs:`, docs/lora.md).

K LoRA runs (rank 16 on every projection, η 2), alike but for their seeds, of one base config:
  together : one deployment trains the K runs at once, its replicas and its learner shared, the runs' waiting
             batches decoded as one (`runs:`, rollout.engine.max_batch_size K times the run's batch);
  in_turn  : the K runs one after another, each a LoRA run of its own deployment: what a user without several
             runs per deployment does.
Both arms start from the same YAML (the base example with `SETUPS`' overrides), the learner pinned to core 0 and
the replicas to core 1 (on two cores, the stand-in for a learner and replicas on devices of their own).
Figures, each arm in the same sitting:
  - aggregate learner steps per second: K x steps over the wall time from each deployment's first lease to its
    last step (summed over the in-turn runs), so start-up is left out of both;
  - the learner's busy share (the bound: a learner busy all the time cannot step faster), over that wall time;
  - the CPU every role's processes used in that wall time, per step, and the cores busy in all (the bound on
    two cores: an arm that keeps both busy cannot step faster without doing less per step);
  - peak resident memory (VmHWM) of the learner process and of the replica process;
  - each run's held-out greedy accuracy after its last step (equal samples: the same steps of the same B).
Setups (`--setups`):
  demo-gen     : the demo, one replica taking one group per engine call: one run alone leaves its learner idle
                 most of the time (generation-bound);
  demo-learner : the demo with eight optimizer steps per batch: one run alone keeps its learner busy;
  smollm2-gen  : SmolLM2-135M-Instruct on reasoning-gym sums, one replica taking one group per engine call.
  demo-gen-vllm: demo-gen on a vLLM replica (one engine, every run's LoRA adapters, batches merged by vLLM).

    .venv/bin/python bench/multi_runs.py [--runs 4] [--setups demo-gen demo-learner smollm2-gen] [--steps N]
    (or: asyncrl bench multi_runs)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import yaml
from common import RESULTS, emit, mean_sd, provenance
from demo_runs import run_demo

from asyncrl.core.runtime.events import read_events

REPO = Path(__file__).resolve().parents[1]
LORA = ["learner.lora.enabled=true", "learner.lora.rank=16", "learner.lora.alpha=32", "controller.eta=2",
        "learner.cpus=[0]", "rollout.cpus=[1]", "learner.threads=1", "rollout.engine.threads=1",
        "teacher.enabled=false", "learner.algo.opd.enabled=false"]
"""Every setup's runs: LoRA on the base, the learner and the replicas on cores of their own, no teacher."""
SETUPS = {
    "demo-gen": ("tiny-arith", 60, ["learner.lr=2.0e-4", "rollout.replicas=1", "rollout.leases_per_batch=1"]),
    "demo-learner": ("tiny-arith", 60, ["learner.lr=2.0e-4", "rollout.replicas=2", "learner.minibatches=8"]),
    "smollm2-gen": ("smollm2-arithmetic", 4, ["learner.lr=1.0e-4", "rollout.replicas=1",
                                              "rollout.leases_per_batch=1"]),
    "demo-gen-vllm": ("tiny-arith", 60, ["learner.lr=2.0e-4", "rollout.replicas=1", "rollout.leases_per_batch=1",
                                         "rollout.engine.type=vllm"]),
}
"""Setup -> (base example, default steps per run, its overrides)."""
RESULTS_FILE = RESULTS / "multi_runs.json"
"""Where the figures go; `--setups` measures those setups again and keeps the others' last figures."""


def measured(run_dirs: list[Path]) -> tuple[float, float, float, int]:
    """(the first lease granted, the last step, as wall-clock times; the learner's busy seconds between them;
    the steps), over `run_dirs` together."""
    leases = [e["t"] for d in run_dirs for e in read_events(d, "controller") if e["kind"] == "lease_granted"]
    steps = [e for d in run_dirs for e in read_events(d, "learner") if e["kind"] == "step"]
    return min(leases), max(e["t"] for e in steps), sum(e["time/step_s"] for e in steps), len(steps)


def cpu_in_window(samples: list[tuple[float, dict[str, float]]], start: float, end: float) -> dict[str, float]:
    """Role -> CPU seconds its processes used from `start` to `end`: the last sample at or before `start`
    against the first at or after `end` (`demo_runs.sample_cpu`, every half second)."""
    before = max((s for s in samples if s[0] <= start), key=lambda s: s[0], default=samples[0])[1]
    after = min((s for s in samples if s[0] >= end), key=lambda s: s[0], default=samples[-1])[1]
    return {role: after[role] - before.get(role, 0.0) for role in after}


def final_accuracy(run_dir: Path) -> float:
    return [e["accuracy"] for e in read_events(run_dir, "learner") if e["kind"] == "eval"][-1]


def base_config(tmp: Path, example: str, runs: int) -> tuple[Path, Path]:
    """(the base example as one run, the same with `runs` runs alike but for their seeds), written under `tmp`."""
    tree = yaml.safe_load((REPO / "examples" / f"{example}.yaml").read_text())
    tmp.mkdir(parents=True, exist_ok=True)
    alone, together = tmp / "alone.yaml", tmp / "together.yaml"
    alone.write_text(yaml.safe_dump(tree))
    batch = tree.get("rollout", {}).get("engine", {}).get("max_batch_size", 64)
    tree.setdefault("rollout", {}).setdefault("engine", {})["max_batch_size"] = batch * runs
    tree["runs"] = [{"name": f"seed-{i}", "overrides": {"seed": i}} for i in range(runs)]
    together.write_text(yaml.safe_dump(tree))
    return alone, together


def arm_figures(dirs: list[Path], windows: list[tuple[float, float, float, int]], peaks: dict,
                cpu: dict[str, float]) -> dict:
    """The arm's figures over its measured `windows` (`measured`); `cpu`: role -> CPU seconds in them."""
    wall = sum(end - start for start, end, _, _ in windows)
    steps = sum(n for _, _, _, n in windows)
    return {"wall_s": wall, "steps": steps, "steps_per_s": steps / wall,
            "learner_busy": sum(busy for _, _, busy, _ in windows) / wall,
            "cores_busy": round(sum(cpu.values()) / wall, 3),
            "cpu_ms_per_step": {role: round(1e3 * seconds / steps, 1) for role, seconds in sorted(cpu.items())
                                if seconds > 0},
            "learner_peak_mib": peaks["learner"] / 2**20, "replica_peak_mib": peaks["rollout"] / 2**20,
            "final_accuracies": [final_accuracy(d) for d in dirs]}


def together(tmp: Path, config: Path, runs: int, steps: int, extra: list[str]) -> dict:
    run_dir, peaks, samples = tmp / "together", {}, []
    run_demo(run_dir, [*LORA, *extra, f"learner.total_steps={steps}", f"learner.eval_every={steps}"],
             config=config, memory_peaks=peaks, cpu_samples=samples, events_dir=run_dir / "seed-0", timeout_s=3600)
    dirs = [run_dir / f"seed-{i}" for i in range(runs)]
    window = measured(dirs)
    return arm_figures(dirs, [window], peaks, cpu_in_window(samples, *window[:2]))


def in_turn(tmp: Path, config: Path, runs: int, steps: int, extra: list[str]) -> dict:
    dirs, windows, peaks, cpu = [], [], {}, {}
    for i in range(runs):
        run_dir, samples = tmp / f"alone-{i}", []
        run_demo(run_dir, [*LORA, *extra, f"seed={i}", f"learner.total_steps={steps}", f"learner.eval_every={steps}"],
                 config=config, memory_peaks=peaks, cpu_samples=samples, timeout_s=3600)
        dirs.append(run_dir)
        windows.append(measured([run_dir]))
        start, end, busy, n = windows[-1]
        for role, seconds in cpu_in_window(samples, start, end).items():
            cpu[role] = cpu.get(role, 0.0) + seconds
        print(f"in_turn run {i}: {n / (end - start):.2f} steps/s, learner busy {busy / (end - start):.0%}",
              file=sys.stderr, flush=True)
    figures = arm_figures(dirs, windows, peaks, cpu)
    figures["learner_busy_alone"] = [round(busy / (end - start), 3) for start, end, busy, _ in windows]
    return figures


def compare(one: dict, many: dict) -> dict:
    mean_alone, sd_alone = mean_sd(one["final_accuracies"])
    mean_many, sd_many = mean_sd(many["final_accuracies"])
    return {"throughput_ratio": round(many["steps_per_s"] / one["steps_per_s"], 3),
            "learner_memory_ratio": round(many["learner_peak_mib"] / one["learner_peak_mib"], 3),
            "replica_memory_ratio": round(many["replica_peak_mib"] / one["replica_peak_mib"], 3),
            "learner_busy_alone_median": statistics.median(one["learner_busy_alone"]),
            "accuracy": {"together_mean": round(mean_many, 4), "together_sd": round(sd_many, 4),
                         "in_turn_mean": round(mean_alone, 4), "in_turn_sd": round(sd_alone, 4)}}


def kept_setups(runs: int) -> dict:
    """The setups of the last results (same number of runs) that this invocation does not measure again, each
    with the provenance of the command that measured it."""
    if not RESULTS_FILE.is_file():
        return {}
    last = json.loads(RESULTS_FILE.read_text())
    if last.get("runs") != runs:
        return {}
    return {name: {"provenance": last["provenance"], **setup} for name, setup in last["setups"].items()
            if name in SETUPS}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--setups", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    parser.add_argument("--steps", type=int, default=0, help="steps per run (0: the setup's own)")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-", ignore_cleanup_errors=True) as tmp:
        for name in args.setups:
            example, default_steps, extra = SETUPS[name]
            steps = args.steps or default_steps
            alone, many = base_config(Path(tmp) / name, example, args.runs)
            arms = {"in_turn": in_turn(Path(tmp) / name, alone, args.runs, steps, extra),
                    "together": together(Path(tmp) / name, many, args.runs, steps, extra)}
            results[name] = {"example": example, "steps": steps, "overrides": extra, **arms,
                             **compare(arms["in_turn"], arms["together"]), "provenance": provenance()}
            print(f"{name}: together {arms['together']['steps_per_s']:.2f} steps/s against "
                  f"{arms['in_turn']['steps_per_s']:.2f} ({results[name]['throughput_ratio']}x); cores busy "
                  f"{arms['together']['cores_busy']} against {arms['in_turn']['cores_busy']}",
                  file=sys.stderr, flush=True)
    results = {**kept_setups(args.runs), **results}
    emit("multi_runs", {"runs": args.runs, "lora": LORA, "setups": results},
         {f"{name}: {arm}": results[name][arm]["steps_per_s"] for name in results for arm in ("in_turn", "together")},
         "aggregate learner steps / s",
         f"{args.runs} LoRA runs on one base, together against one after another (same sitting)")


if __name__ == "__main__":
    main()
