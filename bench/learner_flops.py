"""The learner's step at a real size against what this machine's matmuls can do, measured in the same run.

A random checkpoint of Qwen2.5-0.5B's shape (494M parameters, vocabulary 151,936, the embedding tied; float32)
trains as the learner trains it (`learner.trainer.Trainer`, decoupled PPO, a batch of `--batch` sequences of
`--prompt` + `--response` tokens) on `--threads` threads. Figures:

- the FLOPs of one step, counted by torch's `FlopCounterMode` over a whole `Trainer.step` (every matrix
  product, attention's too, the backward and what it recomputes included): what the step asks of the machine;
- the step's FLOP/s: those FLOPs over the median time of the steps run without the counter;
- the machine's matmul throughput: GEMMs of the step's own shapes in the forwards' dtype (each projection of
  a layer at the step's token count, forward and both backward products, and the LM head on the response
  tokens), best of several runs each, on the same threads; their FLOP-weighted throughput is what the step
  could reach if it were all matmul at those shapes. A square 2048 GEMM is reported beside it;
- where the time goes: `torch.profiler`'s self CPU time of the step's top operators, and the share in matrix
  products;
- memory: peak resident memory less the runtime before the model, per parameter (weights, gradients and
  AdamW's two moments are 16 bytes; the rest is activations, the logits' chunks and the allocator);
- what two of the learner's choices buy, on this model: one AdamW update with torch's for-loop kernel against
  the fused one the learner uses, and the LM head's three products at a logit chunk of 2^24 elements (110 rows
  of this vocabulary) against 2^26 (441 rows), the chunk the learner uses.

`--dtype bfloat16` runs the forwards in bfloat16 over float32 master weights, as a `model.dtype: bfloat16`
learner does, and measures the bound in bfloat16.

    .venv/bin/python bench/learner_flops.py [--batch 8] [--prompt 32] [--response 96] [--steps 3] [--threads 2]
        [--dtype bfloat16] [--model-path DIR --tag T]
    (--model-path: another checkpoint, e.g. artifacts/smollm2-135m-instruct; results into learner_flops-T)
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
from pathlib import Path

import torch
from common import best_gflops, best_seconds, emit, qwen2_half_billion, timed_steps, train_batch

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def model_gemms(config, tokens: int, response_tokens: int) -> list[tuple[int, int, int, int]]:
    """(m, k, n, count) of the training step's matrix products per forward-and-backward: every projection of
    every layer at `tokens` rows, the LM head at `response_tokens`, each as the forward and its two backward
    products (the input's gradient, the weight's)."""
    h, i, v, layers = config.hidden_size, config.intermediate_size, config.vocab_size, config.num_hidden_layers
    kv = h // config.num_attention_heads * config.num_key_value_heads
    forward = [(tokens, h, h, 2 * layers), (tokens, h, kv, 2 * layers), (tokens, h, i, 2 * layers),
               (tokens, i, h, layers), (response_tokens, h, v, 1)]
    out = []
    for m, k, n, count in forward:
        out += [(m, k, n, count), (m, n, k, count), (k, m, n, count)]  # y = xW; dx = dy W^T; dW = x^T dy
    return out


def shaped_throughput(gemms, dtype: torch.dtype) -> tuple[float, list[dict]]:
    """FLOP-weighted GFLOP/s of `gemms` in `dtype` (total FLOPs over the total time at each one's best
    throughput)."""
    total_flops = total_s = 0.0
    rows = []
    for m, k, n, count in gemms:
        gflops = best_gflops(m, k, n, dtype=dtype)
        flops = 2.0 * m * k * n * count
        total_flops += flops
        total_s += flops / (gflops * 1e9)
        rows.append({"m": m, "k": k, "n": n, "gflops": round(gflops, 1)})
    return total_flops / total_s / 1e9, rows


def adamw_update_s(params: list, fused: bool, repeats: int = 3) -> float:
    """Best seconds of one AdamW update of `params` (their gradients as they are) with the for-loop or the fused
    kernel, after a first update that makes the optimizer state."""
    optimizer = torch.optim.AdamW(params, lr=1e-6, weight_decay=0.01, fused=fused or None)
    return best_seconds(optimizer.step, repeats)


def lm_head_gflops(config, rows: int, dtype: torch.dtype) -> dict:
    """GFLOP/s of the LM head's forward and two backward products on a `rows`-row chunk."""
    h, v = config.hidden_size, config.vocab_size
    return {"forward": round(best_gflops(rows, h, v, dtype=dtype), 1),
            "input_grad": round(best_gflops(rows, v, h, dtype=dtype), 1),
            "weight_grad": round(best_gflops(v, rows, h, dtype=dtype), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--response", type=int, default=96)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model-path", default="", help="a checkpoint to train instead (e.g. the real-model example's)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="the forwards' dtype (model.dtype): bfloat16 runs them over float32 master weights, "
                             "as the learner does, and measures the bound in bfloat16")
    parser.add_argument("--tag", default="", help="suffix of the result files (docs/results/learner_flops-TAG.*)")
    args = parser.parse_args()

    import transformers  # noqa: F401 - loaded before the runtime's memory is read

    from asyncrl.core.config.schema import LearnerConfig, SamplingConfig
    from asyncrl.core.model.modeling import load_causal_lm
    from asyncrl.core.model.sampling import SamplingParams
    from asyncrl.learner.trainer import Trainer

    torch.set_num_threads(args.threads)
    runtime = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    model_dir = Path(args.model_path) if args.model_path else qwen2_half_billion(
        Path(tempfile.gettempdir()) / "asyncrl-bench-qwen2-0.5b")
    model = load_causal_lm(str(model_dir))
    parameters = sum(p.numel() for p in model.parameters())
    cfg = LearnerConfig.model_validate({"lr": 1e-6, "algo": {"preset": "decoupled_token_is"}})
    dtype = getattr(torch, args.dtype)
    trainer = Trainer(model, cfg, SamplingParams.from_config(SamplingConfig()), pad_id=0,
                      half=None if dtype == torch.float32 else dtype)
    batch = train_batch(args.batch, args.prompt, args.response, model.config.vocab_size)

    step_s = timed_steps(trainer, batch, args.steps)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    step = statistics.median(step_s[1:] or step_s)

    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        trainer.step(batch, version=1)
    flops = counter.get_total_flops()

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        trainer.step(batch, version=1)
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total_us = sum(e.self_cpu_time_total for e in ops)
    matmul_us = sum(e.self_cpu_time_total for e in ops if e.key in MATMUL_OPS)
    top = [{"op": e.key, "share": round(e.self_cpu_time_total / total_us, 3)} for e in ops[:10]]

    tokens, response_tokens = args.batch * (args.prompt + args.response), args.batch * args.response
    shaped, gemm_rows = shaped_throughput(model_gemms(model.config, tokens, response_tokens), dtype)
    square = best_gflops(2048, 2048, 2048, dtype=dtype)
    achieved = flops / step / 1e9
    for p in model.parameters():  # a gradient for every weight, as after a step
        p.grad = torch.randn_like(p) * 1e-3
    params = list(model.parameters())
    adamw = {"for_loop_s": round(adamw_update_s(params, fused=False), 3),
             "fused_s": round(adamw_update_s(params, fused=True), 3)}
    chunks = {f"2^{bits} ({(1 << bits) // model.config.vocab_size} rows)":
              lm_head_gflops(model.config, (1 << bits) // model.config.vocab_size, dtype) for bits in (24, 26)}
    result = {
        "model": args.model_path or "Qwen2.5-0.5B shape, random weights", "dtype": args.dtype,
        "parameters": parameters,
        "batch": args.batch, "prompt_tokens": args.prompt, "response_tokens": args.response, "threads": args.threads,
        "step_s": round(step, 3), "step_gflop": round(flops / 1e9, 1), "step_gflops_per_s": round(achieved, 1),
        "matmul_gflops_per_s_model_shapes": round(shaped, 1), "matmul_gflops_per_s_square_2048": round(square, 1),
        "step_over_model_shaped_matmul": round(achieved / shaped, 3),
        "step_over_square_matmul": round(achieved / square, 3),
        "profile_matmul_share": round(matmul_us / total_us, 3), "profile_top_ops": top,
        "learner_peak_gib": round(peak / (1 << 30), 2),
        "learner_peak_less_runtime_bytes_per_parameter": round((peak - runtime) / parameters, 1),
        "adamw_update": adamw, "lm_head_chunk_gflops_per_s": chunks,
        "gemms": gemm_rows,
    }
    emit("learner_flops" + (f"-{args.tag}" if args.tag else ""), result,
         {"learner step": achieved, "matmul, model shapes": shaped, "matmul, square 2048": square}, "GFLOP/s",
         f"{parameters / 1e6:.0f}M learner step, {args.dtype}: {100 * achieved / shaped:.0f}% of the matmul throughput at its shapes")


if __name__ == "__main__":
    main()
