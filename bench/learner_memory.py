"""The learner's host-memory plan (`learner.memory_plan`) against the peak it measurably reaches, at a real size.

A Qwen2.5-0.5B-shaped model (494M parameters, vocabulary 151,936, the embedding tied; random weights, float32)
trains as the learner does: AdamW steps on a batch of `--batch` x `--tokens` tokens, the background push's
snapshot (a copy of the weights) and the background checkpoint's host copy (`learner.checkpoint.stage_shards`:
model and optimizer state) held while the next step trains (where they overlap in a run). Each of three settings
runs in a process of its own (its peak resident memory, `ru_maxrss`, is its own): everything in the background
(the defaults), the checkpoint in line, both in line. Per setting: the plan before the start (its total, and
total + 25% headroom), the prediction after the first step (its measured peak plus the snapshots, what
`MemoryWatch` checks), the measured peak of the whole run, and measured over each.

Activations apart: the in-line setting runs once more on a single 8-token sequence, where activations are
nearly nil. Its peak less the runtime, per parameter, is what the learner holds whatever the batch (weights,
gradients, AdamW's moments, the allocator's slack); the difference to the full batch's peak is the batch's
activations.

    .venv/bin/python bench/learner_memory.py [--batch 4] [--tokens 64] [--steps 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import time

import torch
from common import emit, qwen2_half_billion_model

GIB = 1 << 30
SETTINGS = {
    "defaults (checkpoint and push in the background)": (True, True),
    "checkpoint in line": (False, True),
    "checkpoint and push in line": (False, False),
}


def measure(checkpoint_background: bool, push_background: bool, batch: int, tokens: int, steps: int, out) -> None:
    import transformers  # noqa: F401 - loaded before the runtime's memory is read

    from asyncrl.learner.checkpoint import stage_shards
    from asyncrl.learner.memory_plan import plan_memory

    torch.set_num_threads(2)
    runtime = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # what is resident before the model
    model = qwen2_half_billion_model()
    params = list(model.parameters())
    weight_bytes = sum(t.numel() * t.element_size() for t in params) + sum(
        b.numel() * b.element_size() for b in model.buffers())
    plan = plan_memory(weight_bytes=weight_bytes, trainable_bytes=sum(p.numel() * p.element_size() for p in params),
                       kl_reference=False, push_in_background=push_background,
                       checkpoint_background=checkpoint_background)
    optimizer = torch.optim.AdamW(params, lr=1e-6)
    ids = torch.randint(0, model.config.vocab_size, (batch, tokens))
    held = []  # what the background push and checkpoint keep while the next step trains
    step_s = []
    predicted = None
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        step_s.append(time.perf_counter() - t0)
        if predicted is None:  # what the learner's check after its first step predicts
            first_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            predicted = first_peak + plan.push_snapshot + plan.checkpoint_snapshot
        held.clear()
        if push_background:
            with torch.no_grad():
                held.append([p.detach().clone() for p in params])
        if checkpoint_background:
            held.append(stage_shards(model, optimizer))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out.put({"plan_total_gib": round(plan.total / GIB, 2), "plan_needed_gib": round(plan.needed / GIB, 2),
             "predicted_after_first_step_gib": round(predicted / GIB, 2),
             "measured_peak_gib": round(peak / GIB, 2), "measured_over_planned": round(peak / plan.total, 3),
             "measured_over_predicted": round(peak / predicted, 3),
             "runtime_gib": round(runtime / GIB, 2),
             "measured_less_runtime_over_needed": round((peak - runtime) / plan.needed, 3),
             "parts_gib": {k: round(v / GIB, 2) for k, v in plan.parts().items()},
             "step_s": round(min(step_s), 1), "parameters": sum(p.numel() for p in params)})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")

    def run(checkpoint_bg: bool, push_bg: bool, batch: int, tokens: int) -> dict:
        out = ctx.Queue()
        proc = ctx.Process(target=measure, args=(checkpoint_bg, push_bg, batch, tokens, args.steps, out))
        proc.start()
        result = out.get()
        proc.join()
        return result

    results = {}
    for name, (checkpoint_bg, push_bg) in SETTINGS.items():
        results[name] = run(checkpoint_bg, push_bg, args.batch, args.tokens)
        print(name, results[name], flush=True)
    no_batch = run(False, False, 1, 8)
    print("in line, one 8-token sequence", no_batch, flush=True)
    in_line = results["checkpoint and push in line"]
    params = in_line["parameters"]

    def per_param(gib: float) -> float:
        return round(gib * GIB / params, 1)

    fixed = per_param(no_batch["measured_peak_gib"] - no_batch["runtime_gib"])
    activations = {
        "fixed_bytes_per_parameter": fixed,
        "batch_activations_gib": round(in_line["measured_peak_gib"] - no_batch["measured_peak_gib"], 2),
        "per_parameter_less_runtime": {name: per_param(r["measured_peak_gib"] - r["runtime_gib"])
                                       for name, r in results.items()},
        "per_parameter_less_runtime_and_activations": {
            name: round(per_param(r["measured_peak_gib"] - r["runtime_gib"]) - per_param(
                in_line["measured_peak_gib"] - no_batch["measured_peak_gib"]), 1) for name, r in results.items()},
        "target_bytes_per_parameter_plus_activations": 20,
    }
    print("activations apart", activations, flush=True)
    emit("learner_memory", {"model": "Qwen2.5-0.5B shape, random weights, float32", "batch": args.batch,
                            "tokens": args.tokens, "settings": results, "one_short_sequence": no_batch,
                            "activations_apart": activations,
                            "worst_measured_less_runtime_over_needed": round(max(
                                r["measured_less_runtime_over_needed"] for r in results.values()), 3),
                            "worst_measured_over_predicted": round(max(
                                r["measured_over_predicted"] for r in results.values()), 3)},
         {f"{short}: {what}": r[key]
          for r, short in zip(results.values(), ("defaults", "ckpt in line", "both in line"))
          for what, key in (("plan", "plan_needed_gib"), ("1st step", "predicted_after_first_step_gib"),
                            ("measured", "measured_peak_gib"))},
         "GiB", "learner host memory: plan, prediction after step 1, measured peak (0.5B fp32)")


if __name__ == "__main__":
    main()
