"""How much of a bfloat16 push changes from one learner step to the next, on the real model: what sparse delta
pushes would carry over a thin link.

The learner keeps float32 master weights and engines serve bfloat16, so a push is the policy rounded to
bfloat16. An update smaller than half a bfloat16 step at a weight leaves that element's rounding unchanged;
the peers' delta syncs rest on this. Here SmolLM2-135M-Instruct (`model.source: smollm2-135m-instruct`, the
real weights) trains with the learner's own `Trainer` (decoupled PPO, AdamW as the learner builds it) on a
batch of `--batch` sequences of 64 tokens with mixed rewards, `--steps` steps at each learning rate of `--lrs`
(1e-6: the RL rates the peers quote; 5e-5: the demo's). After each step the bfloat16 rounding of every weight
is compared with the previous push's, and with the push `--eta` steps back (what a replica that missed pushes
needs). A sparse push carries a 4-byte index and a 2-byte value per changed element; its bytes are set
against the dense bfloat16 push and timed at 50 Mb/s.

    .venv/bin/python bench/bf16_deltas.py [--lrs 1e-6 1e-5 5e-5] [--steps 4] [--batch 8] [--eta 2]
    (or: asyncrl bench bf16_deltas)
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
from common import emit, train_batch

REPO = Path(__file__).resolve().parents[1]
SOURCE, MODEL_DIR = "smollm2-135m-instruct", REPO / "artifacts" / "smollm2-135m-instruct"
SPARSE_BYTES = 4 + 2
"""An index (int32) and a bfloat16 value per changed element."""
LINK_BPS = 50e6


def bf16_copy(model) -> list[torch.Tensor]:
    return [p.detach().to(torch.bfloat16) for p in model.parameters()]


def changed(a: list[torch.Tensor], b: list[torch.Tensor]) -> int:
    return sum(int((x.view(torch.int16) != y.view(torch.int16)).sum()) for x, y in zip(a, b))


def run_lr(lr: float, steps: int, batch_size: int, eta: int) -> dict:
    from asyncrl.core.config.schema import LearnerConfig, SamplingConfig
    from asyncrl.core.model.modeling import load_causal_lm
    from asyncrl.core.model.sampling import SamplingParams
    from asyncrl.learner.trainer import Trainer

    model = load_causal_lm(str(MODEL_DIR))
    total = sum(p.numel() for p in model.parameters())
    cfg = LearnerConfig.model_validate({"lr": lr, "algo": {"preset": "decoupled_token_is"}})
    trainer = Trainer(model, cfg, SamplingParams.from_config(SamplingConfig()), pad_id=0)
    batch = train_batch(batch_size, 32, 32, model.config.vocab_size)
    pushes = [bf16_copy(model)]
    per_step, per_eta = [], []
    for step in range(steps):
        trainer.step(batch, version=step + 1)
        pushes.append(bf16_copy(model))
        per_step.append(changed(pushes[-1], pushes[-2]) / total)
        if len(pushes) > eta:
            per_eta.append(changed(pushes[-1], pushes[-1 - eta]) / total)
        pushes = pushes[-(eta + 1):]
    step_fraction = statistics.median(per_step)
    dense = 2 * total
    sparse = SPARSE_BYTES * step_fraction * total
    return {"changed_per_step": [round(f, 5) for f in per_step], "changed_median": round(step_fraction, 5),
            f"changed_over_{eta}_steps": [round(f, 5) for f in per_eta],
            "dense_mb": round(dense / 1e6, 1), "sparse_mb": round(sparse / 1e6, 1),
            "sparse_over_dense": round(sparse / dense, 4),
            "dense_s_at_50mbps": round(dense * 8 / LINK_BPS, 1), "sparse_s_at_50mbps": round(sparse * 8 / LINK_BPS, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lrs", nargs="+", type=float, default=[1e-6, 1e-5, 5e-5])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--eta", type=int, default=2)
    args = parser.parse_args()
    from asyncrl.tools.model_sources import fetch_source

    fetch_source(SOURCE, MODEL_DIR)
    torch.manual_seed(0)
    result: dict = {"model": SOURCE, "batch": args.batch, "tokens": 64, "steps": args.steps, "eta": args.eta}
    for lr in args.lrs:
        result[f"lr_{lr:g}"] = run_lr(lr, args.steps, args.batch, args.eta)
        print(lr, result[f"lr_{lr:g}"], flush=True)
    emit("bf16_deltas", result, {f"lr {lr:g}": 100 * result[f"lr_{lr:g}"]["changed_median"] for lr in args.lrs},
         "% of bfloat16 elements changed per step",
         "a step's bfloat16 push against the last: " + ", ".join(
             f"lr {lr:g} {100 * result[f'lr_{lr:g}']['changed_median']:.1f}% changed" for lr in args.lrs))


if __name__ == "__main__":
    main()
