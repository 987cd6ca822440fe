"""What `model.determinism: bitwise` costs: the torch engine's tokens/s and the learner's step time, off vs
bitwise, same prompts, same batch, one run; and where the cost comes from.

Two model sizes, random Qwen2 weights with the arith tokenizer: the demo's shape (width 128, 2 layers) and a
~25M-parameter one (width 512, 8 layers, FFN 2048). Per size:
- engine: `--prompts` x `--n` samples of `--max-new-tokens`, a fresh torch engine per mode (bitwise samples
  seeded per prompt, as a run's replicas do), modes alternating over `--trials` timed batches after a warm-up;
- learner: `Trainer.step` (proximal forward fused into the training forward, backward, AdamW) on the batch the
  off engine generated, modes alternating over `--trials` timed steps after a warm-up;
- where it goes: the learner's no-grad forward of that batch with the plain kernels, with only the GEMMs and
  activations batch invariant (the dispatch mode around a plain-attention model), and whole (bitwise);
- the mismatch: max |logp_learner - logp_behav| over the batch each mode's engine generated (bitwise: 0).

    .venv/bin/python bench/determinism_cost.py [--prompts 8] [--n 8] [--max-new-tokens 24] [--trials 5]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path

import torch
from common import build_random_qwen2, emit

from asyncrl.core.config.schema import EngineConfig, LearnerConfig, TaskConfig
from asyncrl.core.determinism.invariant_model import InvariantKernels, use_invariant_kernels
from asyncrl.core.determinism.seeds import prompt_seed
from asyncrl.core.engines.torch_engine import TorchEngine
from asyncrl.core.model.modeling import load_causal_lm, sequence_logprobs
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.core.tasks import get_task
from asyncrl.learner.batch import TrainBatch
from asyncrl.learner.trainer import Trainer
from asyncrl.push.receiving import BroadcastReceiving

SIZES = {"demo": (128, 2, 512), "25M": (512, 8, 2048)}
MODES = ("off", "bitwise")


def to_batch(prompts: list[list[int]], groups) -> TrainBatch:
    rows = [(p, g) for p, group in zip(prompts, groups) for g in group]
    width = max(len(g.token_ids) for _, g in rows)
    mask = torch.tensor([[1.0] * len(g.token_ids) + [0.0] * (width - len(g.token_ids)) for _, g in rows])
    behav = torch.tensor([g.logp_behav + [0.0] * (width - len(g.logp_behav)) for _, g in rows])
    n, size = len(rows), len(groups[0])
    return TrainBatch(
        entry_ids=[f"{i}-0" for i in range(len(groups))], group_ids=[f"g{r // size}" for r in range(n)],
        trajectory_ids=[f"t{r}" for r in range(n)], sequences=[list(p) + g.token_ids for p, g in rows],
        response_starts=[len(p) for p, _ in rows], logp_behav=behav,
        token_versions=torch.zeros(n, width, dtype=torch.long), response_mask=mask,
        rewards=torch.tensor([float(r % 3 == 0) for r in range(n)]),
        group_index=torch.tensor([r // size for r in range(n)]),
    )


def engine_rate(engine: TorchEngine, prompts, params, n, seeds) -> tuple[float, list]:
    started = time.perf_counter()
    groups = engine.generate(prompts, params, n, seeds=seeds)
    tokens = sum(len(g.token_ids) for group in groups for g in group)
    return tokens / (time.perf_counter() - started), groups


def max_delta(model, batch: TrainBatch, params) -> float:
    with torch.no_grad():
        logp, mask = sequence_logprobs(model, batch.sequences, batch.response_starts, params)
    return float((logp[:, : batch.logp_behav.shape[1]] - batch.logp_behav).abs()[mask].max())


def forward_s(model, batch: TrainBatch, params, repeats: int, mode=contextlib.nullcontext) -> float:
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        with torch.no_grad(), mode():
            sequence_logprobs(model, batch.sequences, batch.response_starts, params)
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def measure_size(name: str, args) -> dict:
    hidden, layers, ffn = SIZES[name]
    path = str(build_random_qwen2(Path(f"/tmp/asyncrl-bench-qwen2-{hidden}x{layers}"), hidden, layers, ffn))
    task = get_task(TaskConfig())
    prompts = [task.train_prompt(i).token_ids for i in range(args.prompts)]
    seeds = [prompt_seed(0, i) for i in range(args.prompts)]
    params = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens)
    cfg = EngineConfig(threads=args.threads, max_batch_size=args.prompts * args.n)
    engines = {mode: TorchEngine(cfg, path, determinism=mode, weights=BroadcastReceiving()) for mode in MODES}
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    batches = {}
    for trial in range(args.trials + 1):
        for mode in MODES:
            rate, groups = engine_rate(engines[mode], prompts, params, args.n, seeds if mode == "bitwise" else None)
            if trial:  # the first is the warm-up
                rates[mode].append(rate)
            batches[mode] = to_batch(prompts, groups)
    for engine in engines.values():
        engine.close()
    models = {mode: load_causal_lm(path) for mode in MODES}
    use_invariant_kernels(models["bitwise"])
    deltas = {mode: max_delta(models[mode], batches[mode], params) for mode in MODES}
    trainers = {mode: Trainer(models[mode], LearnerConfig(lr=1e-7), params, pad_id=0) for mode in MODES}
    steps: dict[str, list[float]] = {mode: [] for mode in MODES}
    for trial in range(args.trials + 1):
        for mode in MODES:
            started = time.perf_counter()
            trainers[mode].step(batches["off"], version=1)
            if trial:
                steps[mode].append(time.perf_counter() - started)
    plain = load_causal_lm(path)
    breakdown = {
        "plain": forward_s(plain, batches["off"], params, args.trials),
        "invariant_gemm_and_activations": forward_s(plain, batches["off"], params, args.trials,
                                                    lambda: InvariantKernels(strict=False)),
        "bitwise": forward_s(models["bitwise"], batches["off"], params, args.trials),
    }
    engine = {mode: round(statistics.median(rates[mode]), 1) for mode in MODES}
    step = {mode: round(statistics.median(steps[mode]) * 1000, 1) for mode in MODES}
    return {
        "model": path, "parameters": sum(p.numel() for p in plain.parameters()),
        "engine_tokens_per_s": engine, "engine_slowdown": round(engine["off"] / engine["bitwise"], 2),
        "learner_step_ms": step, "learner_slowdown": round(step["bitwise"] / step["off"], 2),
        "forward_ms": {k: round(v * 1000, 1) for k, v in breakdown.items()},
        "max_abs_delta": deltas, "batch_tokens": int(batches["off"].response_mask.sum()),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    per_size = {name: measure_size(name, args) for name in args.sizes}
    result = {"bench": "determinism_cost", "prompts": args.prompts, "n": args.n,
              "max_new_tokens": args.max_new_tokens, "threads": args.threads, "trials": args.trials,
              "sizes": per_size}
    bars = {}
    for name, figures in per_size.items():
        bars[f"{name} engine"] = figures["engine_slowdown"]
        bars[f"{name} learner"] = figures["learner_slowdown"]
    emit("determinism_cost", result, bars, "bitwise time / off time",
         "what bitwise costs: engine generation and learner step")


if __name__ == "__main__":
    main()
