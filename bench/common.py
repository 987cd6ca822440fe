"""Shared bench plumbing: a random Qwen2-shaped checkpoint of a chosen size, an in-process weight push, a demo
run with its CPU use, accuracy curves read at a common budget, and writing each result as JSON (stdout and
docs/results/<name>.json, with the command and the machine) plus a PNG bar chart. docs/results.md is generated
from those files (`asyncrl bench --report`)."""

from __future__ import annotations

import datetime
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import torch

RESULTS = Path(os.environ.get("ASYNCRL_RESULTS_DIR") or Path(__file__).resolve().parents[1] / "docs" / "results")


def build_random_qwen2(out_dir: Path, hidden: int, layers: int, intermediate: int, seed: int = 0) -> Path:
    """A randomly initialised Qwen2 with the arith tokenizer (heads of 64, as vLLM's CPU kernels need);
    reused when it already exists."""
    from transformers import Qwen2ForCausalLM

    from asyncrl.core.config.schema import TinyModelConfig
    from asyncrl.core.model.tokenizer import ModelTokenizer, build_char_tokenizer, save_tokenizer
    from asyncrl.tools.tiny_model import model_config

    if (out_dir / "config.json").exists():
        return out_dir
    char_tokenizer = build_char_tokenizer()
    codec = ModelTokenizer.from_tokenizers(char_tokenizer)
    shape = TinyModelConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=hidden // 64,
                            num_key_value_heads=max(1, hidden // 256), intermediate_size=intermediate)
    config = model_config(shape, codec)
    config.max_position_embeddings = 256
    torch.manual_seed(seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    Qwen2ForCausalLM(config).save_pretrained(str(out_dir), safe_serialization=True)
    save_tokenizer(char_tokenizer, out_dir, model_max_length=256)
    return out_dir


def qwen2_half_billion(out_dir: Path) -> Path:
    """Qwen2.5-0.5B's shape with random weights, saved once."""
    if not (out_dir / "config.json").exists():
        qwen2_half_billion_model().save_pretrained(str(out_dir), safe_serialization=True)
    return out_dir


def qwen2_half_billion_model():
    """Qwen2.5-0.5B's shape (494M parameters, vocabulary 151,936, the embedding tied), random weights (seed 0),
    float32, in memory."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(qwen2_half_billion_config()).float()


def qwen2_half_billion_config():
    """Qwen2.5-0.5B's configuration: hidden 896, 24 layers, MLP 4864, 14 query and 2 key-value heads."""
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                       tie_word_embeddings=True, eos_token_id=2, pad_token_id=0)


def random_adapter(model, spec, seed: int, std: float = 0.02) -> dict[str, torch.Tensor]:
    """A LoRA adapter of `spec` (an `AdapterSpec`) for every linear module of `model` its targets name, under
    peft's saved names, A and B drawn from N(0, std) with `seed`."""
    from asyncrl.core.lora.spec import adapter_name

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, module in model.named_modules():
        if type(module) is torch.nn.Linear and name.rsplit(".", 1)[-1] in spec.target_modules:
            out[adapter_name(name, "A")] = torch.randn(spec.rank, module.in_features, generator=gen) * std
            out[adapter_name(name, "B")] = torch.randn(module.out_features, spec.rank, generator=gen) * std
    return out


def train_batch(batch: int, prompt: int, response: int, vocab: int, group: int = 4, shared_prompts: bool = False,
                rewards: list[float] | None = None):
    """A learner batch of `batch` random sequences (`prompt` + `response` tokens) in groups of `group`, each
    sequence with a prompt of its own or, `shared_prompts`, one per group (as a group's samples share it);
    `rewards` per sequence (default: 0/1 alternating, every group mixed)."""
    from asyncrl.learner.batch import TrainBatch

    g = torch.Generator().manual_seed(0)
    n = batch
    if shared_prompts:
        prompts = [torch.randint(3, vocab, (prompt,), generator=g).tolist() for _ in range(n // group)]
        sequences = [prompts[r // group] + torch.randint(3, vocab, (response,), generator=g).tolist() for r in range(n)]
    else:
        sequences = torch.randint(3, vocab, (n, prompt + response), generator=g).tolist()
    return TrainBatch(
        entry_ids=[f"{i}-0" for i in range(n // group)], group_ids=[f"g{r // group}" for r in range(n)],
        trajectory_ids=[f"t{r}" for r in range(n)], sequences=sequences, response_starts=[prompt] * n,
        logp_behav=-torch.rand(n, response, generator=g) * 3, token_versions=torch.zeros(n, response, dtype=torch.long),
        response_mask=torch.ones(n, response),
        rewards=torch.tensor(rewards if rewards is not None else [float(r % 2) for r in range(n)]),
        group_index=torch.tensor([r // group for r in range(n)]),
    )  # fmt: skip


def best_seconds(work, repeats: int, warmup: int = 1) -> float:
    """The fewest seconds `work()` took over `repeats` timed calls, after `warmup` untimed ones."""
    for _ in range(warmup):
        work()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - t0)
    return best


def best_gflops(m: int, k: int, n: int, repeats: int = 5, dtype: torch.dtype = torch.float32) -> float:
    """Best GFLOP/s of a `dtype` (float32 unless named) [m, k] x [k, n] product over `repeats` runs (after one
    warm-up)."""
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    return 2 * m * k * n / best_seconds(lambda: torch.mm(a, b), repeats) / 1e9


def timed_steps(trainer, batch, steps: int) -> list[float]:
    """Seconds of each of `steps` `Trainer.step`s on `batch`."""
    import time

    seconds = []
    for _ in range(steps):
        t0 = time.perf_counter()
        trainer.step(batch, version=1)
        seconds.append(time.perf_counter() - t0)
    return seconds


def push_weights(engine, named: list[tuple[str, torch.Tensor]], version: int, bucket_bytes: int = 64 << 20,
                 adapter=None):
    """Push `named` into `engine` over a real gloo group (sender thread = rank 0, engine = rank 1); `adapter`:
    the `AdapterSpec` when `named` is a LoRA adapter."""
    from asyncrl.core.wire.push_contract import tensor_metas
    from asyncrl.push.broadcast import host_store, make_group
    from asyncrl.push.plan import PushPlan
    from asyncrl.push.transfer import send_weights

    store = host_store("127.0.0.1", 0, 120)
    plan = PushPlan(push_id=f"bench-{version}", version=version, store_address=f"127.0.0.1:{store.port}", store_key=store.key, world_size=2, transport="gloo", tensors=tensor_metas(named),
                    bucket_bytes=bucket_bytes, timeout_s=120, adapter=adapter)

    def send():
        group = make_group(plan, 0, store)
        send_weights(group, named, plan)
        group.close()

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    stats = engine.update_weights(plan, 1)
    sender.join(120)
    return stats


def emit(name: str, result: dict, bars: dict[str, float], ylabel: str, title: str) -> None:
    """Print `result` as one JSON line, keep it in docs/results/<name>.json with the command that produced it
    and the machine it ran on, and draw `bars` as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = {**result, "provenance": provenance()}
    print(json.dumps(result))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    crowded = len(bars) > 4 or sum(map(len, bars)) > 60
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(bars)), 4.5 if crowded else 3.5))
    ax.bar(list(bars), list(bars.values()), color=["#888888"] + ["#1f77b4"] * (len(bars) - 1))
    for i, value in enumerate(bars.values()):
        ax.annotate(f"{value:.3g}", (i, value), ha="center", va="bottom", fontsize=8 if crowded else 10)
    if crowded:  # labels slanted, so that long or many do not run into one another
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
    ax.set_ylabel(ylabel)
    ax.set_title(textwrap.fill(title, 90), fontsize=9)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=100)
    plt.close(fig)


def cpu_description(cpuinfo: Path) -> str:
    """The first processor of `cpuinfo` as "<model name> (family F model M, <widest vector unit>)": a
    virtual machine often names only the vendor's line ("AMD EPYC"), and two generations behind one name
    time differently; "" without the file."""
    if not cpuinfo.exists():
        return ""
    first: dict[str, str] = {}
    for line in cpuinfo.read_text().splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        first[key.strip()] = value.strip()
    flags = set(first.get("flags", "").split())
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    details = [f"family {first['cpu family']} model {first['model']}"] if "cpu family" in first and "model" in first else []
    return f"{first.get('model name', 'unknown')} ({', '.join([*details, vector])})"


def provenance() -> dict:
    """The command (as typed from the repository root), the machine and the time of a result."""
    machine = {"arch": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
               "torch": torch.__version__}
    cpu = cpu_description(Path("/proc/cpuinfo"))
    if cpu:
        machine["cpu"] = cpu
    if torch.cuda.is_available():
        machine["gpu"] = torch.cuda.get_device_name(0)
    return {"command": " ".join([".venv/bin/python", f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]]),
            "machine": machine, "date": datetime.date.today().isoformat(), "commit": STARTED_AT}


def _commit() -> str:
    """The checkout's commit, with "+changes" when the code differs from it ("" outside git)."""
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()
        # Results written by earlier benches are not changes to what runs.
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":!docs/results", ":!docs/results.md"], cwd=repo,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head + ("+changes" if dirty else "")


STARTED_AT = _commit()
"""The commit the bench started at (edits made while it runs do not change what it ran)."""


def accuracy_at(curve: list[dict], key: str, x: float) -> float:
    """Accuracy at `x` of `key` (samples or wall_s), interpolated linearly between evaluations."""
    points = [(p[key], p["accuracy"]) for p in curve]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1] if x > points[-1][0] else points[0][1]


def mean_sd(values: list[float]) -> tuple[float, float]:
    """(mean, sample standard deviation; 0 for one value)."""
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


DEMO_GROUP_SIZE = 8
"""The demo's sampling.group_size."""
WITHOUT_TEACHER = ["learner.algo.opd.enabled=false", "teacher.enabled=false"]
"""Overrides that make the demo learn from its rewards alone (no distillation from its teacher)."""


def rollout_events(run_dir: Path) -> list[dict]:
    """Every replica's events of a run, replica after replica."""
    from asyncrl.core.runtime.events import read_events

    return [e for path in sorted((run_dir / "events").glob("rollout-*.jsonl")) for e in read_events(run_dir, path.stem)]


def accuracy_curve(run_dir: Path, learner: list[dict], scored_kinds: tuple[str, ...]) -> list[dict]:
    """The held-out accuracy of each evaluation in `learner` (the run's learner events) with the wall seconds
    since the first lease and the samples generated by then: the trajectories of each replica event of
    `scored_kinds` (the demo's G where an event does not say)."""
    from asyncrl.core.runtime.events import read_events

    start = min(e["t"] for e in read_events(run_dir, "controller") if e["kind"] == "lease_granted")
    scored = [(e["t"], e.get("trajectories") or DEMO_GROUP_SIZE) for e in rollout_events(run_dir)
              if e["kind"] in scored_kinds]
    return [{"step": e["step"], "accuracy": e["accuracy"], "wall_s": e["t"] - start,
             "samples": sum(n for t, n in scored if t <= e["t"])} for e in learner if e["kind"] == "eval"]


def run_seeded(arms, seeds: int, run, report) -> dict[str, list[dict]]:
    """`run(arm, seed, run_dir)` for every seed and arm, the arms interleaved within each seed (a drift of the
    machine's speed falls on every arm alike), in a temporary directory; after each, `report(result)` is printed
    as that run's line. Returns the results by arm, in seed order."""
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-") as tmp:
        for seed in range(seeds):
            for arm in arms:
                result = run(arm, seed, Path(tmp) / f"{arm}-{seed}")
                runs[arm].append(result)
                print(f"{arm} seed={seed}: {report(result)}", file=sys.stderr, flush=True)
    return runs


def accuracy_figures(runs: dict[str, list[dict]]) -> tuple[float, float, dict[str, dict]]:
    """(the samples every run generated, the wall seconds every run lasted, per arm: final accuracy, and
    accuracy at that many samples and seconds, each mean and stdev over the seeds) from runs whose results hold
    their accuracy `curve` (`accuracy_curve`). Equal samples and equal time are the fair comparisons of arms
    that spend differently per step."""
    budget = min(r["curve"][-1]["samples"] for results in runs.values() for r in results)
    horizon = min(r["curve"][-1]["wall_s"] for results in runs.values() for r in results)
    figures = {}
    for arm, results in runs.items():
        finals = [r["curve"][-1]["accuracy"] for r in results]
        final, final_sd = mean_sd(finals)
        at_samples, at_samples_sd = mean_sd([accuracy_at(r["curve"], "samples", budget) for r in results])
        at_wall, at_wall_sd = mean_sd([accuracy_at(r["curve"], "wall_s", horizon) for r in results])
        figures[arm] = {
            "final_accuracy_mean": final, "final_accuracy_stdev": final_sd, "final_accuracies": finals,
            "samples_mean": statistics.mean(r["curve"][-1]["samples"] for r in results),
            "wall_s_mean": statistics.mean(r["curve"][-1]["wall_s"] for r in results),
            "accuracy_at_equal_samples_mean": at_samples, "accuracy_at_equal_samples_stdev": at_samples_sd,
            "accuracy_at_equal_wall_mean": at_wall, "accuracy_at_equal_wall_stdev": at_wall_sd,
        }  # fmt: skip
    return budget, horizon, figures
