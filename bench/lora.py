"""LoRA against full fine-tuning at a real size: bytes per push, push time, the learner's peak memory and step time.

A random checkpoint of Qwen2.5-0.5B's shape (494M parameters, vocabulary 151,936, the embedding tied; float32;
`--shape 120m`: hidden 1024, 8 layers, MLP 4096, a 16-token vocabulary, 122M parameters nearly all in linear
layers, the case least favourable to LoRA's byte count) trains as the learner trains it (`learner.trainer.Trainer`, decoupled PPO, a batch of `--batch` sequences of
`--prompt` + `--response` tokens) in a process of its own per mode, so each peak resident memory (`ru_maxrss`)
is that mode's alone: full weights, then LoRA (`learner.lora`: rank `--rank` on every linear module, peft). After
the steps, the learner keeps the background push's snapshot of what it pushes (every weight, or the adapter)
as a run does. Then the same process pushes what a step would push to a torch engine over a real gloo group
(a sender thread as rank 0, the engine as rank 1): the whole push as the sender sees it, and the engine's part
split into receiving (the broadcast) and applying (a pointer swap for full weights, the merge onto the base
for an adapter). On loopback the broadcast runs at memory speed; across machines the bytes decide it.

    .venv/bin/python bench/lora.py [--shape 0.5b|120m] [--batch 8] [--prompt 32] [--response 32] [--steps 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import build_random_qwen2, emit, push_weights, qwen2_half_billion, timed_steps, train_batch

MIB = 1 << 20
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


SHAPES = {"0.5b": qwen2_half_billion,
          "120m": lambda out: build_random_qwen2(out, hidden=1024, layers=8, intermediate=4096)}
DESCRIBED = {"0.5b": "Qwen2.5-0.5B shape (494M parameters, embedding tied), random weights, float32",
             "120m": "Qwen2 shape, hidden 1024, 8 layers, MLP 4096, 16-token vocabulary, random weights, float32"}


def measure(mode: str, model_dir: str, args, out) -> None:
    import transformers  # noqa: F401 - loaded before the runtime's memory is read

    from asyncrl.core.config.schema import EngineConfig, LearnerConfig, SamplingConfig
    from asyncrl.core.engines.torch_engine import TorchEngine
    from asyncrl.core.lora.spec import AdapterSpec
    from asyncrl.core.model.modeling import load_causal_lm, named_weights
    from asyncrl.core.model.sampling import SamplingParams
    from asyncrl.learner.adapters import inject_adapters, lora_parameters
    from asyncrl.learner.trainer import Trainer
    from asyncrl.push.receiving import BroadcastReceiving

    torch.set_num_threads(2)
    runtime = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    model = load_causal_lm(model_dir)
    parameters = sum(p.numel() for p in model.parameters())
    lora = {"enabled": mode == "lora", "rank": args.rank, "alpha": 2.0 * args.rank, "target_modules": TARGETS}
    cfg = LearnerConfig.model_validate({"lr": 1e-5, "lora": lora, "algo": {"preset": "decoupled_token_is"}})
    spec: AdapterSpec | None = inject_adapters(model, cfg.lora) if mode == "lora" else None
    trainer = Trainer(model, cfg, SamplingParams.from_config(SamplingConfig()), pad_id=0)
    batch = train_batch(args.batch, args.prompt, args.response, model.config.vocab_size)
    step_s = timed_steps(trainer, batch, args.steps)
    named = lora_parameters(model) if spec is not None else named_weights(model)
    snapshot = [(name, t.detach().clone()) for name, t in named]  # the background push's copy
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    optimizer_bytes = sum(t.numel() * t.element_size() for state in trainer.optimizer.state.values()
                          for t in state.values() if torch.is_tensor(t))
    del trainer, model
    engine = TorchEngine(EngineConfig(threads=2), model_dir, weights=BroadcastReceiving())
    push_s, receive_s, apply_s = [], [], []
    for version in range(1, args.pushes + 1):
        t0 = time.perf_counter()
        stats = push_weights(engine, snapshot, version, adapter=spec)
        push_s.append(time.perf_counter() - t0)
        receive_s.append(stats.extra["receive_s"])
        apply_s.append(stats.load_s - stats.extra["receive_s"])
    out.put({
        "parameters": parameters, "trainable_parameters": trainable,
        "bytes_per_push": sum(t.numel() * t.element_size() for _, t in snapshot),
        "push_s": round(statistics.median(push_s), 4), "receive_s": round(statistics.median(receive_s), 4),
        "apply_s": round(statistics.median(apply_s), 4),
        "learner_peak_gib": round(peak / (1 << 30), 3), "learner_peak_less_runtime_gib": round((peak - runtime) / (1 << 30), 3),
        "optimizer_state_mib": round(optimizer_bytes / MIB, 1),
        "step_s": round(statistics.median(step_s[1:] or step_s), 3),
    })  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--response", type=int, default=32)
    parser.add_argument("--shape", choices=SHAPES, default="0.5b")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--pushes", type=int, default=3)
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args()
    model_dir = SHAPES[args.shape](Path(tempfile.gettempdir()) / f"asyncrl-bench-lora-{args.shape}")
    ctx = mp.get_context("spawn")
    results = {}
    for mode in ("full", "lora"):
        out = ctx.Queue()
        proc = ctx.Process(target=measure, args=(mode, str(model_dir), args, out))
        proc.start()
        results[mode] = out.get()
        proc.join()
        print(mode, results[mode], flush=True)
    full, lora = results["full"], results["lora"]
    emit("lora", {
        "model": DESCRIBED[args.shape],
        "lora": {"rank": args.rank, "alpha": 2 * args.rank, "target_modules": TARGETS},
        "batch": args.batch, "tokens": args.prompt + args.response, "modes": results,
        "push_bytes_ratio": round(full["bytes_per_push"] / lora["bytes_per_push"], 1),
        "push_time_ratio": round(full["push_s"] / lora["push_s"], 2),
        "learner_peak_ratio": round(full["learner_peak_less_runtime_gib"] / lora["learner_peak_less_runtime_gib"], 2),
        "step_time_ratio": round(full["step_s"] / lora["step_s"], 2),
    }, {"full: MiB/push": full["bytes_per_push"] / MIB, "LoRA: MiB/push": lora["bytes_per_push"] / MIB,
        "full: peak GiB x100": 100 * full["learner_peak_less_runtime_gib"],
        "LoRA: peak GiB x100": 100 * lora["learner_peak_less_runtime_gib"]},
        "MiB / GiB x100", f"LoRA r{args.rank} vs full weights, {full['parameters'] / 1e6:.0f}M parameters")  # fmt: skip


if __name__ == "__main__":
    main()
