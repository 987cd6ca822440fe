"""What a checkpoint costs the learner: written in line (the learner stops for the whole save) against written in
the background (`learner.checkpoint.background`: the learner stops to copy the state to host memory, a thread
writes the files while training goes on), one run, the same model and steps.

A randomly initialised Qwen2 (768 x 12 by default, ~100M parameters, float32, AdamW: about 1.2 GB of model and
optimizer state, plus the Hugging Face export) trains `--steps` steps on a fixed batch through the learner's
own `CheckpointSaver` and `Checkpointer`, with one checkpoint after the first step; the same steps without a
checkpoint are the baseline, measured in the same run (modes alternate, best of `--trials`). Per mode: the
stall (the time the checkpoint stopped training) and the wall time of all the steps until the checkpoint is
on disk. The headline is the stall, in line against in the background; the wall-time cost over the baseline
says what the background write, which shares the cores with training, still costs (`ratio_cost`: null when
the background's cost is within the spread of the baseline's own runs). Files go to a temporary
directory on the local disk (through the page cache). `--train-threads 1` trains on one core and leaves the
other to the write: a stand-in for a learner that trains on a GPU while its host's cores are free
(the result goes to `checkpoint_stall-<name>`).

    .venv/bin/python bench/checkpoint_stall.py [--hidden 768] [--layers 12] [--steps 8] [--trials 2]
                                               [--train-threads N] [--name SUFFIX]
    (or: asyncrl bench checkpoint_stall)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from common import build_random_qwen2, emit
from transformers import AutoTokenizer

from asyncrl.core.buffer.memory import MemoryBuffer
from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.core.model.modeling import load_causal_lm, named_weights
from asyncrl.core.runtime.events import MemoryEvents
from asyncrl.learner.checkpoint import Checkpointer
from asyncrl.learner.checkpoint_index import CheckpointMeta
from asyncrl.learner.checkpoint_saver import CheckpointSaver
from asyncrl.learner.learner_metrics import LearnerMetrics
from asyncrl.push.flat import bind_parameters

BATCH, TOKENS = 4, 128


def train_steps(model, optimizer, batch: torch.Tensor, steps: int, saver: CheckpointSaver | None) -> dict:
    """`steps` train steps, a checkpoint after the first (with `saver`); wall time until the last step is done
    and the checkpoint is on disk."""
    stall_s = 0.0
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 1 and saver is not None:
            stall_s = saver.save(model, optimizer, CheckpointMeta(step, step, 0, time.time()), [])
    if saver is not None:
        saver.wait()
    return {"wall_s": time.perf_counter() - t0, "stall_s": stall_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--train-threads", type=int, default=0, help="torch threads for training (0: torch's own)")
    parser.add_argument("--name", default="", help="suffix of the result's name")
    args = parser.parse_args()
    if args.train_threads:
        torch.set_num_threads(args.train_threads)
    torch.manual_seed(0)
    model_dir = build_random_qwen2(Path(f"/tmp/asyncrl-bench-qwen2-{args.hidden}x{args.layers}"), args.hidden,
                                   args.layers, 4 * args.hidden)
    model = load_causal_lm(str(model_dir))
    bind_parameters(model, named_weights(model), 64 << 20)  # as the learner holds it (zero-copy push layout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    batch = torch.randint(3, model.config.vocab_size, (BATCH, TOKENS))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    parameters = sum(p.numel() for p in model.parameters())
    best: dict[str, dict] = {}
    baseline_walls: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        events = MemoryEvents()
        train_steps(model, optimizer, batch, 1, None)  # warm-up: the optimizer's moments exist from here on
        for trial in range(args.trials):
            for mode in ("none", "in_line", "background"):
                saver = None
                if mode != "none":
                    config = AsyncRLConfig.model_validate({"run_dir": f"{tmp}/{mode}-{trial}"})
                    saver = CheckpointSaver(Checkpointer(config, tokenizer), MemoryBuffer(), events,
                                            LearnerMetrics(), background=mode == "background")
                result = train_steps(model, optimizer, batch, args.steps, saver)
                if mode == "none":
                    baseline_walls.append(result["wall_s"])
                if mode not in best or result["wall_s"] < best[mode]["wall_s"]:
                    best[mode] = result
        written = [e["seconds"] for e in events.of_kind("checkpoint_saved") if e["background"]]
    base = best["none"]["wall_s"]
    cost = {mode: best[mode]["wall_s"] - base for mode in ("in_line", "background")}
    result = {
        "parameters": parameters, "state_gb": 3 * 4 * parameters / 1e9, "steps": args.steps, "trials": args.trials,
        "train_threads": torch.get_num_threads(),
        "step_s": base / args.steps,
        "wall_s": {mode: r["wall_s"] for mode, r in best.items()},
        "stall_s": {mode: best[mode]["stall_s"] for mode in ("in_line", "background")},
        "background_write_s": min(written),
        "cost_s": cost,
        # The spread of the baseline's own walls: a cost below it is not told apart from nothing.
        "noise_s": max(baseline_walls) - min(baseline_walls),
        "ratio_stall": best["in_line"]["stall_s"] / max(1e-9, best["background"]["stall_s"]),
    }
    noise = max(result["noise_s"], 1e-3)
    result["ratio_cost"] = cost["in_line"] / cost["background"] if cost["background"] > noise else None
    emit("checkpoint_stall" + (f"-{args.name}" if args.name else ""), result,
         {"in line stall": best["in_line"]["stall_s"], "background stall": best["background"]["stall_s"],
          "in line cost": cost["in_line"], "background cost": cost["background"]},
         "seconds", f"checkpoint, {parameters / 1e6:.0f}M params: stall {result['ratio_stall']:.0f}x less, wall cost "
                    + (f"{result['ratio_cost']:.1f}x less" if result["ratio_cost"] else "within noise in the background"))


if __name__ == "__main__":
    main()
