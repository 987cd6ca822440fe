"""Generated tokens per second: the vLLM engine vs the torch engine, same prompts, same sampling, one run, and
both against what this machine could do for the same decode steps, measured in the same run.

Both engines load the same checkpoint (default: a random Qwen2 of width 512, 8 layers, ~25M parameters, built
once under /tmp; `--size 0.5b` for Qwen2.5-0.5B's shape, random float32 weights; `--model-path` for any
other, e.g. the demo's artifacts/tiny-arith/policy). Each engine gets `--warmup` untimed batches, then
`--repeats` timed ones; tokens/s = response tokens actually generated / wall time of generate(). Engines run
one after the other in this process; the ratio is vllm / torch.

The bound: a decode step of `--prompts` x `--n` sequences is at least the products of every linear layer's
weights with one row per sequence (each weight read once from memory, 2 x rows x parameters FLOPs), the LM
head's included. Those products alone, run in the model's order with the model's own weights on the same
threads (best of several passes), take `decode_gemm_s`; rows / decode_gemm_s is the tokens/s an engine could
reach if a step were nothing else (no attention, norms, sampling, scheduling or prefill). Below that is the
machine's roofline for the step: every weight read once at the copy bandwidth's read rate (a 1 GiB tensor
copied) or its FLOPs at a square 2048 GEMM's rate, whichever takes longer. The gap between the two is what the
matrix library loses on products of few rows.

    .venv/bin/python bench/engine_throughput.py [--size 25m|0.5b] [--prompts 32] [--n 8] [--max-new-tokens 48]
        [--threads 2] [--vllm-memory 0.2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import best_gflops, best_seconds, build_random_qwen2, emit, qwen2_half_billion

from asyncrl.core.config.schema import EngineConfig, TaskConfig
from asyncrl.core.engines.factory import make_engine
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.core.tasks import get_task
from asyncrl.push.receiving import BroadcastReceiving


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


def decode_bound(model_path: str, rows: int, repeats: int = 5) -> dict:
    """What the decode step of `rows` sequences costs at least: every linear layer's weights times one row per
    sequence, in the model's order (`decode_gemm_s`, best of `repeats` passes after one warm-up), and the
    tokens/s that allows."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}

    def step() -> None:
        for w in weights:
            torch.nn.functional.linear(inputs[w.shape[1]], w)

    with torch.no_grad():
        best = best_seconds(step, repeats)
    parameters = sum(w.numel() for w in weights)
    return {"rows": rows, "decode_gemm_s": round(best, 5), "tokens_per_s": round(rows / best, 1),
            "weight_bytes": parameters * 4, "gflops_per_s": round(2 * rows * parameters / best / 1e9, 1),
            "weights_read_gb_per_s": round(parameters * 4 / best / 1e9, 2)}


def roofline(bound: dict, copy_gb_per_s: float, peak_gflops: float) -> dict:
    """The decode step's physical floor: reading every weight once (at the copy's read rate, half its bytes
    moved) or computing its products at the square GEMM's rate, whichever is longer; and the tokens/s that
    allows."""
    rows, weight_bytes = bound["rows"], bound["weight_bytes"]
    read_s = weight_bytes / (copy_gb_per_s / 2 * 1e9)
    compute_s = 2 * rows * weight_bytes / 4 / (peak_gflops * 1e9)
    return {"read_s": round(read_s, 5), "compute_s": round(compute_s, 5),
            "tokens_per_s": round(rows / max(read_s, compute_s), 1)}


def copy_bandwidth(gib: float = 1.0, repeats: int = 3) -> float:
    """GB/s of a large float32 tensor copy (bytes read + bytes written), best of `repeats`."""
    src = torch.randn(int(gib * (1 << 30)) // 4)
    dst = torch.empty_like(src)
    return round(2 * src.numel() * 4 / best_seconds(lambda: dst.copy_(src), repeats) / 1e9, 2)


def checkpoint(args) -> str:
    """The model both engines load (built once under the temporary directory when it is one of ours)."""
    if args.model_path:
        return args.model_path
    if args.size == "0.5b":
        from asyncrl.core.model.tokenizer import build_char_tokenizer, save_tokenizer

        path = qwen2_half_billion(Path(tempfile.gettempdir()) / "asyncrl-bench-qwen2-0.5b")
        if not (path / "tokenizer.json").exists():  # vLLM loads one; prompts and samples stay token ids
            save_tokenizer(build_char_tokenizer(), path, model_max_length=256)
        return str(path)
    return str(build_random_qwen2(Path("/tmp/asyncrl-bench-qwen2-512x8"), 512, 8, 2048))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--size", choices=("25m", "0.5b"), default="25m", help="the random checkpoint, without --model-path")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vllm-memory", type=float, default=0.2,
                    help="vLLM's share of the node's memory (weights and KV cache): 0.5 for the 0.5B model")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tag", default="", help="suffix of the result files (docs/results/engine_throughput-TAG.*)")
    args = ap.parse_args()
    from transformers import AutoConfig

    torch.set_num_threads(args.threads)
    path = checkpoint(args)
    bound = decode_bound(path, args.prompts * args.n)
    bandwidth = copy_bandwidth()
    peak = round(best_gflops(2048, 2048, 2048, repeats=3), 1)
    floor = roofline(bound, bandwidth, peak)
    task = get_task(TaskConfig())
    prompts = [task.train_prompt(i).token_ids for i in range(args.prompts)]
    params = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens)
    results = {}
    for kind in ("torch", "vllm"):
        cfg = EngineConfig(type=kind, threads=args.threads, max_batch_size=args.prompts * args.n,
                           max_model_len=min(128, AutoConfig.from_pretrained(path).max_position_embeddings),
                           gpu_memory_utilization=args.vllm_memory)
        engine = make_engine(cfg, path, "float32", seed=0, weights=BroadcastReceiving())
        try:
            results[kind] = measure(engine, prompts, params, args.n, args.warmup, args.repeats)
        finally:
            engine.close()
    ratio = results["vllm"]["tokens_per_s"] / results["torch"]["tokens_per_s"]
    for figures in results.values():
        figures["over_decode_bound"] = round(figures["tokens_per_s"] / bound["tokens_per_s"], 3)
        figures["over_roofline"] = round(figures["tokens_per_s"] / floor["tokens_per_s"], 3)
    result = {"bench": "engine_throughput", "model": path, "parameters": bound["weight_bytes"] // 4,
              "prompts": args.prompts, "n": args.n, "max_new_tokens": args.max_new_tokens, "threads": args.threads,
              **{k: v for k, v in results.items()}, "vllm_over_torch": round(ratio, 3), "decode_bound": bound,
              "copy_gb_per_s": bandwidth, "square_gemm_gflops_per_s": peak, "roofline": floor}
    emit("engine_throughput" + (f"-{args.tag}" if args.tag else ""), result,
         {"roofline": floor["tokens_per_s"], "decode GEMM bound": bound["tokens_per_s"],
          "torch": results["torch"]["tokens_per_s"],
          "vllm": results["vllm"]["tokens_per_s"]},
         "generated tokens / s", f"generation, {args.prompts}x{args.n} samples (vllm/torch {ratio:.2f})")


if __name__ == "__main__":
    main()
