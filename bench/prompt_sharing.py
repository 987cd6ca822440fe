"""The learner's step with each group's prompt forwarded once (`learner.share_prompts`) against every
sequence forwarded whole, same model, same batch, one run; and the layout the learner chooses by cost
(`prompt_sharing.choose_layout`: packed rows or the KV copy) against the KV copy alone.

A step is the real `Trainer.step` (the demo's objective: decoupled PPO with token IS and OPD advantages; one
mini-batch, so the training forward doubles as the proximal one): forward with grad, advantages, loss,
backward, optimizer step. B = 64 sequences in groups of G = 8, in four shapes: "demo" (a model of the demo's
size, a 7-token prompt and 2 to 5 response tokens, as `examples/tiny-arith.yaml` trains), "long_prompt"
(128-token prompts, 32 response tokens: a task whose prompt outweighs its answer), "uneven" (20-token
prompts, 2 to 40 response tokens: much padding after the short ones) and "demo_30m" (the demo's shapes on
the 30M model of `bench/peers.py --size 30m`). The arms alternate inside one loop, each on its own copy of
the model, so drift in machine load hits all alike; each reports the median of the timed steps after
warm-up, and the positions (padding included) its training forward puts through the model.

    .venv/bin/python bench/prompt_sharing.py [--repeats 30] [--warmup 5] [--threads 1] [--shapes demo ...]
    (or: asyncrl bench prompt_sharing)
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import build_random_qwen2, emit

from asyncrl.core.config.schema import LearnerConfig, SamplingConfig
from asyncrl.core.model.modeling import load_causal_lm, sequence_logprobs
from asyncrl.core.model.prompt_sharing import choose_layout, kv_copy_logprobs
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.learner.batch import TrainBatch
from asyncrl.learner.trainer import Trainer

GROUPS, G = 8, 8
SHAPES = {"demo": ("demo", (7, 2, 5)), "long_prompt": ("demo", (128, 32, 32)), "uneven": ("demo", (20, 2, 40)),
          "demo_30m": ("30m", (7, 2, 5))}
"""name -> (model, (prompt tokens, shortest response, longest response))."""
MODELS = {"demo": {"hidden": 128, "layers": 2, "intermediate": 512},
          "30m": {"hidden": 512, "layers": 8, "intermediate": 2048}}
ARMS = ("whole", "kv_copy", "chosen")
ALGO = {"preset": "decoupled_token_is", "opd": {"enabled": True, "mode": "advantage"}}


def make_batch(model, shape: tuple[int, int, int], vocab: int) -> TrainBatch:
    prompt_len, shortest, longest = shape
    gen = torch.Generator().manual_seed(0)
    sequences, starts = [], []
    for _ in range(GROUPS):
        prompt = torch.randint(3, vocab, (prompt_len,), generator=gen).tolist()
        for _ in range(G):
            length = int(torch.randint(shortest, longest + 1, (1,), generator=gen))
            sequences.append(prompt + torch.randint(3, vocab, (length,), generator=gen).tolist())
            starts.append(prompt_len)
    with torch.no_grad():
        logp, mask = sequence_logprobs(model, sequences, starts)
    n, mask = len(sequences), mask.float()
    return TrainBatch(
        entry_ids=[f"{i}-0" for i in range(GROUPS)], group_ids=[f"g{r // G}" for r in range(n)],
        trajectory_ids=[f"t{r}" for r in range(n)], sequences=sequences, response_starts=starts,
        logp_behav=logp, token_versions=torch.zeros(logp.shape, dtype=torch.long), response_mask=mask,
        rewards=(torch.rand(n, generator=gen) < 0.4).float(), group_index=torch.arange(n) // G,
        logp_teacher=(logp + 0.3 * torch.randn(logp.shape, generator=gen)) * mask,
    )  # fmt: skip


def tokens_forwarded(trainer: Trainer, batch: TrainBatch) -> int:
    """Tokens (padding included) that one training forward of `batch` puts through the model."""
    counted, forward = [], trainer.model.base_model.forward
    trainer.model.base_model.forward = lambda *a, **k: counted.append(k["input_ids"].numel()) or forward(*a, **k)
    try:
        with torch.no_grad():
            trainer._logprobs(batch)
    finally:
        trainer.model.base_model.forward = forward
    return sum(counted)


def time_shape(model, shape, vocab: int, warmup: int, repeats: int) -> dict:
    batch = make_batch(model, shape, vocab)
    sampling = SamplingParams.from_config(SamplingConfig())
    trainers = {name: Trainer(copy.deepcopy(model), LearnerConfig.model_validate(
        {"lr": 5e-5, "algo": ALGO, "share_prompts": name != "whole"}), sampling, pad_id=0)
        for name in ARMS}  # fmt: skip
    trainers["kv_copy"].forward_logprobs = kv_copy_logprobs
    times: dict[str, list[float]] = {name: [] for name in trainers}
    for i in range(warmup + repeats):
        for name, trainer in trainers.items():
            start = time.perf_counter()
            trainer.step(batch, version=1)
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    return {"prompt_tokens": shape[0], "response_tokens": list(shape[1:]),
            "chosen_layout": choose_layout(model, batch.sequences, batch.response_starts),
            **{f"{name}_ms": round(ms[name], 2) for name in ARMS},
            **{f"positions_{name}": tokens_forwarded(trainer, batch) for name, trainer in trainers.items()},
            "speedup_vs_whole": round(ms["whole"] / ms["chosen"], 3),
            "speedup_vs_kv_copy": round(ms["kv_copy"] / ms["chosen"], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    args = parser.parse_args()
    shapes = {name: SHAPES[name] for name in args.shapes}
    torch.set_num_threads(args.threads)
    results: dict = {"threads": args.threads, "repeats": args.repeats, "warmup": args.warmup,
                     "batch": {"groups": GROUPS, "group_size": G}}
    with tempfile.TemporaryDirectory() as tmp:
        models = {name: load_causal_lm(build_random_qwen2(Path(tmp) / name, **MODELS[name]))
                  for name in {model for model, _ in shapes.values()}}
    for name, (model_name, shape) in shapes.items():
        model = models[model_name]
        results[name] = time_shape(model, shape, model.config.vocab_size, args.warmup, args.repeats)
        print(name, results[name], flush=True)
    emit("prompt_sharing", results,
         {f"{name}, {arm}": results[name][f"{arm}_ms"] / results[name]["whole_ms"] for name in shapes for arm in ARMS},
         "step time, relative to every sequence whole",
         "prompts forwarded once: " + ", ".join(
             f"{name} {r['speedup_vs_whole']:.2f}x ({r['chosen_layout']}, {r['speedup_vs_kv_copy']:.2f}x KV copy)"
             for name, r in ((n, results[n]) for n in shapes)))


if __name__ == "__main__":
    main()
