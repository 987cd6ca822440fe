"""asyncrl against Hugging Face TRL's `GRPOTrainer` on the demo, settings matched, same sitting, several seeds.

The peer runs in a virtual environment of its own (`~/.cache/asyncrl-bench-peers`, made on first use with the
CPU torch and `trl==1.16.0`; never a dependency of asyncrl), from `bench/peers_trl.py`. Both train the demo's
tiny model (its tokenizer.json as written) on the same 800 prompts in the same order (the arith task's training
stream, indices 0..799), with the same exact-match reward, G = 8, 64 samples per step (8 prompts), a constant
learning rate of 5e-5, clip 0.2, no KL, a token-mean loss, gradient clipping at 1.0, temperature 1, at most 5
new tokens, 100 steps. asyncrl runs with its teacher off (TRL has none) at η = 2 (its default) and at η = 0.
What cannot match: TRL generates with the model it trains (on policy, in the same process, one thing at a time);
asyncrl generates on two replica processes while the learner trains (its decoupled PPO objective corrects for
the staleness), and evaluates the base policy before its first step.

Per arm and seed: the wall seconds from the command's start to the end of the first learner step, the wall time
per step between the first and the last step, the seconds from the last step to the process's exit, the whole
run, and the held-out greedy accuracy of the final policy (the same evaluation for every arm: asyncrl's torch
engine on the saved checkpoint, the demo's 200 held-out prompts).

Where the CPU goes: every process of each run (asyncrl's services, TRL's one process) is sampled from /proc
twice a second, and the CPU seconds between the first and the last step, per step, give each system's work per
step and how many of the machine's cores it kept busy. A system that does W CPU-seconds of work per step cannot
step faster than W / cores on this machine, whatever it overlaps: `per_step_bound_ms` is that floor for
asyncrl's work, and `speedup_bound_vs_trl` TRL's step over it (the most asyncrl's layout could gain over TRL
here without doing less work).

`--size 30m` runs the same comparison on a 30M-parameter model of the demo's family (hidden 512, 8 layers, MLP
2048, the same tokenizer; warm-started by asyncrl's tiny-model builder the first time, the policy both systems
then train), where generation and training are no longer mostly fixed costs.

    .venv/bin/python bench/peers.py [--size demo|30m] [--seeds 3] [--steps 100] [--tag T]   (or: asyncrl bench peers)
    results: docs/results/peers.json (the demo), peers-30m.json; with --tag T, peers[-30m]-T.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

from common import WITHOUT_TEACHER, emit, mean_sd, run_seeded
from demo_runs import cpu_ms_per_step, run_demo, sample_cpu

REPO = Path(__file__).resolve().parents[1]
PEER_VENV = Path.home() / ".cache" / "asyncrl-bench-peers"
PEER_PACKAGES = ["torch==2.13.0", "trl==1.16.0", f"transformers=={version('transformers')}"]
"""TRL on the torch and transformers asyncrl runs on."""
SIZES = {
    "demo": {"result": "peers", "overrides": []},
    "30m": {"result": "peers-30m", "overrides": [
        "model.path=artifacts/tiny-arith-30m/policy", "tiny_model.hidden_size=512", "tiny_model.num_hidden_layers=8",
        "tiny_model.num_attention_heads=8", "tiny_model.num_key_value_heads=2", "tiny_model.intermediate_size=2048",
        "tiny_model.warmstart_until_accuracy=0.4"]},
}
"""Each model size: where its result goes and the `--set` overrides that give asyncrl's demo that model (built
before the first run; the peer trains the same checkpoint). The 30M model's warm start runs its 450 steps, past
the steep rise of its accuracy (a model stopped mid-rise loses it under RL: docs/benchmarks.md), and goes on
until an accuracy of 0.4 (at most 900 steps) should the rise come later on some CPU."""


def model_dir(size: str) -> Path:
    paths = [o.split("=", 1)[1] for o in SIZES[size]["overrides"] if o.startswith("model.path=")]
    return REPO / (paths[0] if paths else "artifacts/tiny-arith/policy")


def peer_python() -> Path:
    """TRL's own virtual environment, made once."""
    python = PEER_VENV / "bin" / "python"
    stamp = PEER_VENV / ("ready-" + "-".join(PEER_PACKAGES).replace("=", ""))
    if not stamp.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *PEER_PACKAGES],
                       check=True)
        stamp.touch()
    return python


def task_and_prompts(steps: int, size: str):
    """The demo's config, task and training prompts, with the size's model built first, as `up` builds it on
    its first run (on a fresh machine, where the task's tokenizer comes from; the peer trains it too)."""
    from asyncrl.core.config.file import load_config
    from asyncrl.core.tasks import task_for_run
    from asyncrl.tools.tiny_model import make_tiny_model

    config = load_config(REPO / "examples" / "tiny-arith.yaml", [*WITHOUT_TEACHER, *SIZES[size]["overrides"]])
    make_tiny_model(config)
    task = task_for_run(config)
    prompts = [task.train_prompt(i) for i in range(steps * 8)]
    return config, task, prompts


def accuracy(model_dir: Path, task) -> float:
    from asyncrl.core.config.schema import EngineConfig
    from asyncrl.core.engines.torch_engine import TorchEngine
    from asyncrl.core.tasks.evaluate import greedy_accuracy

    engine = TorchEngine(EngineConfig(threads=2), str(model_dir))
    try:
        return greedy_accuracy(engine, task, max_new_tokens=5)
    finally:
        engine.close()


def timings(t0: float, step_ends: list[float], exited: float, cpu_samples: list) -> dict:
    steps = max(1, len(step_ends) - 1)
    cpu = sum(cpu_ms_per_step(cpu_samples, step_ends[0], step_ends[-1], steps).values())
    per_step_ms = 1000 * (step_ends[-1] - step_ends[0]) / steps
    return {"first_step_s": step_ends[0] - t0, "per_step_ms": per_step_ms, "exit_s": exited - step_ends[-1],
            "run_s": exited - t0, "cpu_ms_per_step": cpu, "cores_busy": cpu / per_step_ms}


ARMS = {"asyncrl eta=2": 2, "asyncrl eta=0": 0, "TRL GRPOTrainer": None}
"""Each arm and its η (None: the peer)."""


def run_asyncrl(run_dir: Path, seed: int, steps: int, eta: int, task, size: str) -> dict:
    t0, samples = time.time(), []
    learner = run_demo(run_dir, [f"seed={seed}", f"learner.total_steps={steps}", "learner.eval_every=0",
                                 f"controller.eta={eta}", f"learner.checkpoint.save_every={steps}", *WITHOUT_TEACHER,
                                 *SIZES[size]["overrides"]], cpu_samples=samples)
    exited = time.time()
    ends = [e["t"] for e in learner if e["kind"] == "step"]
    final = max((run_dir / "checkpoints").glob("step-*")) / "hf"
    return {**timings(t0, ends, exited, samples), "accuracy": accuracy(final, task)}


def run_peer(data: Path, model: Path, out: Path, steps: int, seed: int) -> tuple[dict, float, float, list]:
    """`bench/peers_trl.py` in TRL's venv on `data`: (its JSON report, start and exit times, CPU samples of its
    process every half second). SystemExit with its output's tail when it fails."""
    t0, samples = time.time(), []
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen([str(peer_python()), str(REPO / "bench" / "peers_trl.py"), "--data", str(data),
                                 "--model", str(model), "--out", str(out), "--steps", str(steps),
                                 "--seed", str(seed)], stdout=stdout, stderr=stderr, text=True)  # fmt: skip
        while proc.poll() is None:
            samples.append(sample_cpu(proc.pid))
            time.sleep(0.5)
        exited = time.time()
        stdout.seek(0)
        stderr.seek(0)
        out_text, err_text = stdout.read(), stderr.read()
    if proc.returncode != 0:
        raise SystemExit(f"TRL failed:\n{out_text[-3000:]}\n{err_text[-3000:]}")
    return json.loads(out_text.strip().splitlines()[-1]), t0, exited, samples


def run_trl(out: Path, seed: int, steps: int, data: Path, task, size: str) -> dict:
    report, t0, exited, samples = run_peer(data, model_dir(size), out, steps, seed)
    return {**timings(t0, report["step_ends"], exited, samples), "accuracy": accuracy(out / "final", task)}

def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--size", choices=sorted(SIZES), default="demo")
    parser.add_argument("--arms", default=",".join(ARMS),
                        help=f"comma-separated, of {', '.join(ARMS)} (the η = 2 arm and TRL's are always run)")
    parser.add_argument("--tag", default="", help="appended to the result's name (a sitting kept apart)")
    args = parser.parse_args()
    os.chdir(REPO)  # the demo's relative model paths, as `up` runs them
    peer_python()
    config, task, prompts = task_and_prompts(args.steps, args.size)
    with tempfile.TemporaryDirectory(prefix="asyncrl-peers-") as tmp:
        data = Path(tmp) / "prompts.json"
        data.write_text(json.dumps({"prompts": [p.text for p in prompts],
                                    "answers": [p.metadata["answer"] for p in prompts],
                                    "lr": config.learner.lr, "batch_size": config.learner.batch_size,
                                    "group_size": config.sampling.group_size,
                                    "max_new_tokens": config.sampling.max_new_tokens}))

        def run(arm: str, seed: int, run_dir: Path) -> dict:
            if ARMS[arm] is None:
                return run_trl(run_dir, seed, args.steps, data, task, args.size)
            return run_asyncrl(run_dir, seed, args.steps, ARMS[arm], task, args.size)

        chosen = {"asyncrl eta=2", "TRL GRPOTrainer", *args.arms.split(",")}
        unknown = chosen - set(ARMS)
        if unknown:
            raise SystemExit(f"--arms: unknown {sorted(unknown)}; choose from {list(ARMS)}")
        arms = run_seeded([a for a in ARMS if a in chosen], args.seeds, run, lambda r: str({k: round(v, 3) for k, v in r.items()}))
    summary = {}
    for name, runs in arms.items():
        summary[name] = {key: round(statistics.median(r[key] for r in runs), 3)
                         for key in ("first_step_s", "per_step_ms", "exit_s", "run_s", "cpu_ms_per_step",
                                     "cores_busy")}
        mean, sd = mean_sd([r["accuracy"] for r in runs])
        summary[name].update(accuracy_mean=round(mean, 4), accuracy_sd=round(sd, 4), runs=runs)
    trl, default = summary["TRL GRPOTrainer"], summary["asyncrl eta=2"]
    parameters = model_parameters(model_dir(args.size))
    result = {"size": args.size, "parameters": parameters, "steps": args.steps, "seeds": args.seeds,
              "peer": f"trl==1.16.0 GRPOTrainer (CPU, 2 threads, float32; transformers {version('transformers')})", "arms": summary,
              "per_step_speedup_vs_trl": round(trl["per_step_ms"] / default["per_step_ms"], 2),
              "run_time_ratio_vs_trl": round(default["run_s"] / trl["run_s"], 2),
              "cores": os.cpu_count(),
              "per_step_bound_ms": round(default["cpu_ms_per_step"] / os.cpu_count(), 1),
              "speedup_bound_vs_trl": round(trl["per_step_ms"] / (default["cpu_ms_per_step"] / os.cpu_count()), 2)}
    emit(SIZES[args.size]["result"] + (f"-{args.tag}" if args.tag else ""), result, {f"{name}: run s": s["run_s"] for name, s in summary.items()},
         "seconds", f"{args.steps} steps, {parameters / 1e6:.1f}M parameters, median of {args.seeds} seeds")


def model_parameters(path: Path) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(path)))
    return sum(p.numel() for p in model.parameters())


if __name__ == "__main__":
    main()
