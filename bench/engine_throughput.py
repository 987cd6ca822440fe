"""Generated tokens per second: the vLLM engine vs the torch engine, same prompts, same sampling, one run.

Both engines load the same checkpoint (default: a random Qwen2 of width 512, 8 layers, ~25M parameters, built
once under /tmp; `--model-path` for any other, e.g. the demo's artifacts/tiny-arith/policy). Each engine gets
`--warmup` untimed batches, then `--repeats` timed ones; tokens/s = response tokens actually generated /
wall time of generate(). Engines run one after the other in this process; the ratio is vllm / torch.

    .venv/bin/python bench/engine_throughput.py [--prompts 32] [--n 8] [--max-new-tokens 48] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from common import build_random_qwen2, emit

from asyncrl.core.config import EngineConfig, TaskConfig
from asyncrl.core.engines.factory import make_engine
from asyncrl.core.sampling import SamplingParams
from asyncrl.core.tasks import get_task


def measure(engine, prompts, params, n, warmup, repeats) -> dict:
    for _ in range(warmup):
        engine.generate(prompts, params, n)
    rates, tokens = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        groups = engine.generate(prompts, params, n)
        elapsed = time.perf_counter() - t0
        count = sum(len(g.token_ids) for group in groups for g in group)
        rates.append(count / elapsed)
        tokens.append(count)
    return {"tokens_per_s": round(statistics.median(rates), 1), "tokens_per_batch": statistics.median(tokens)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tag", default="", help="suffix of the result files (docs/results/engine_throughput-TAG.*)")
    args = ap.parse_args()
    from transformers import AutoConfig

    path = args.model_path or str(build_random_qwen2(Path("/tmp/asyncrl-bench-qwen2-512x8"), 512, 8, 2048))
    task = get_task(TaskConfig())
    prompts = [task.train_prompt(i).token_ids for i in range(args.prompts)]
    params = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens)
    results = {}
    for kind in ("torch", "vllm"):
        cfg = EngineConfig(type=kind, threads=args.threads, max_batch_size=args.prompts * args.n,
                           max_model_len=min(128, AutoConfig.from_pretrained(path).max_position_embeddings),
                           gpu_memory_utilization=0.2)
        engine = make_engine(cfg, path, "float32", seed=0)
        try:
            results[kind] = measure(engine, prompts, params, args.n, args.warmup, args.repeats)
        finally:
            engine.close()
    ratio = results["vllm"]["tokens_per_s"] / results["torch"]["tokens_per_s"]
    result = {"bench": "engine_throughput", "model": path, "prompts": args.prompts, "n": args.n,
              "max_new_tokens": args.max_new_tokens, "threads": args.threads, **{k: v for k, v in results.items()},
              "vllm_over_torch": round(ratio, 3)}
    emit("engine_throughput" + (f"-{args.tag}" if args.tag else ""), result, {"torch": results["torch"]["tokens_per_s"],
                                       "vllm": results["vllm"]["tokens_per_s"]},
         "generated tokens / s", f"generation throughput, {args.prompts}x{args.n} samples (vllm/torch {ratio:.2f})")


if __name__ == "__main__":
    main()
