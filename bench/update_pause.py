"""The pause generation sees during an in-flight weight update, torch engine and vLLM engine, one run.

For each engine: the same batch is generated three times -- without updates, with `--updates` weight pushes
landing while it runs, and without updates again. The pause per update is the extra wall time of the middle
run over the mean of the other two, divided by the number of updates that completed while generate() was
running. Reported next to it: the engine's own pause_s (how long it held generation) and load_s (receive +
load), the median decode step of the baseline, and how many responses mix two or more weight versions (the
update really happened mid-sequence). Default model: the random Qwen2 512x8 of bench/engine_throughput.py.

    .venv/bin/python bench/update_pause.py [--prompts 16] [--n 4] [--max-new-tokens 48] [--updates 3]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

from common import build_random_qwen2, emit, push_weights

from asyncrl.core.config.schema import EngineConfig, TaskConfig
from asyncrl.core.engines.factory import make_engine
from asyncrl.core.model.modeling import load_causal_lm, named_weights
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.core.tasks import get_task
from asyncrl.push.receiving import BroadcastReceiving


def timed_generate(engine, prompts, params, n):
    t0 = time.perf_counter()
    groups = engine.generate(prompts, params, n)
    return time.perf_counter() - t0, groups


def with_updates(engine, prompts, params, n, named, updates: int, spacing_s: float):
    stats, done_at = [], []

    def pusher():
        for _ in range(updates):
            time.sleep(spacing_s)
            stats.append(push_weights(engine, named, engine.weight_version + 1))
            done_at.append(time.perf_counter())

    thread = threading.Thread(target=pusher, daemon=True)
    start = time.perf_counter()
    thread.start()
    elapsed, groups = timed_generate(engine, prompts, params, n)
    end = start + elapsed
    thread.join(300)
    during = sum(1 for t in done_at if t <= end)
    mixed = sum(1 for group in groups for g in group if len(set(g.weight_version)) > 1)
    return elapsed, stats, during, mixed, sum(len(group) for group in groups)


def measure(kind, path, prompts, params, n, updates, threads) -> dict:
    cfg = EngineConfig(type=kind, threads=threads, max_batch_size=len(prompts) * n, max_model_len=128)
    engine = make_engine(cfg, path, "float32", seed=0, weights=BroadcastReceiving())
    named = named_weights(load_causal_lm(path))
    try:
        timed_generate(engine, prompts, params, n)  # warm-up
        push_weights(engine, named, engine.weight_version + 1)  # warm-up of the update path
        base_a, _ = timed_generate(engine, prompts, params, n)
        spacing = base_a / (updates + 1)
        upd_s, stats, during, mixed, total = with_updates(engine, prompts, params, n, named, updates, spacing)
        base_b, _ = timed_generate(engine, prompts, params, n)
    finally:
        engine.close()
    baseline = (base_a + base_b) / 2
    extra = (upd_s - baseline) / max(1, during)
    return {
        "baseline_s": round(baseline, 3), "with_updates_s": round(upd_s, 3), "updates_during_generate": during,
        "pause_per_update_s": round(extra, 4),
        "engine_pause_s_median": round(statistics.median(s.pause_s for s in stats), 4),
        "engine_load_s_median": round(statistics.median(s.load_s for s in stats), 4),
        "decode_step_s": round(baseline / params.max_new_tokens, 4),
        "pause_in_decode_steps": round(extra / (baseline / params.max_new_tokens), 2),
        "responses_with_mixed_versions": f"{mixed}/{total}",
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    path = args.model_path or str(build_random_qwen2(Path("/tmp/asyncrl-bench-qwen2-512x8"), 512, 8, 2048))
    task = get_task(TaskConfig())
    prompts = [task.train_prompt(i).token_ids for i in range(args.prompts)]
    # EOS never ends a response early enough to matter: every sequence decodes about max_new_tokens steps.
    params = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens)
    results = {kind: measure(kind, path, prompts, params, args.n, args.updates, args.threads)
               for kind in ("torch", "vllm")}
    result = {"bench": "update_pause", "model": path, "prompts": args.prompts, "n": args.n,
              "max_new_tokens": args.max_new_tokens, "updates": args.updates, **results}
    emit("update_pause", result,
         {"torch step": results["torch"]["decode_step_s"], "torch pause": results["torch"]["pause_per_update_s"],
          "vllm step": results["vllm"]["decode_step_s"], "vllm pause": results["vllm"]["pause_per_update_s"]},
         "seconds", "pause per in-flight weight update vs one decode step")


if __name__ == "__main__":
    main()
