"""Serving K runs' adapters from one base in the torch engine: one mixed batch (each row through its own run's
adapter, unmerged: `asyncrl.core.lora.row_adapters`) against the alternative at the same memory, the runs'
batches one after another, each on its adapter merged into the one base (a merge before each batch, as a push
does today), and against one run alone.

Each arm decodes the same rows: K adapters x R rows (prompts of P tokens, T new tokens each, temperature 1,
seeded rows) with the adapters of rank 16 on every attention and MLP projection:
  merged_one    : one run's rows alone, its adapter merged (what a LoRA run's replica does today), K x R rows of
                  it in one batch: the speed the shared replica should keep;
  bank_one      : the same rows through the bank, one adapter (the cost of unmerged serving);
  bank_mixed    : K x R rows, R per adapter, in one batch (the runs sharing the replica);
  merged_in_turn: K batches of R rows, each after merging its own adapter into the base (same memory as the bank).
The arms alternate inside one loop so drift in machine load hits all alike; each reports the median of the
timed repeats after warm-up, in generated tokens per second. Memory: the bank's slots against the base's
weights. Shapes: "demo" (the demo's model) and "smollm2" (SmolLM2-135M's shape, random weights).

    .venv/bin/python bench/mixed_adapters.py [--runs 4] [--rows 8] [--repeats 5] [--shapes demo smollm2]
    (or: asyncrl bench mixed_adapters)
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from common import emit, random_adapter

from asyncrl.core.engines.torch_decode import generate_with_model
from asyncrl.core.lora.merge import merged_weight
from asyncrl.core.lora.row_adapters import AdapterBank
from asyncrl.core.lora.spec import AdapterSpec, adapter_name
from asyncrl.core.model.sampling import SamplingParams

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SHAPES = {
    "demo": {"vocab_size": 64, "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2,
             "num_attention_heads": 2, "num_key_value_heads": 1},
    "smollm2": {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                "num_attention_heads": 9, "num_key_value_heads": 3},
}
"""name -> Qwen2 shape (heads of 64)."""
ARMS = ("merged_one", "bank_one", "bank_mixed", "merged_in_turn")


def random_model(shape: dict):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(**shape, head_dim=64, max_position_embeddings=512, tie_word_embeddings=False,
                      pad_token_id=0, eos_token_id=2, bos_token_id=1)
    return Qwen2ForCausalLM(cfg).eval()


def merge_into(model, base: dict[str, torch.Tensor], spec: AdapterSpec, tensors) -> None:
    """The adapter merged onto the kept base weights, swapped into `model` (the torch engine's push)."""
    for name, module in model.named_modules():
        a = tensors.get(adapter_name(name, "A"))
        if a is not None:
            module.weight.data = merged_weight(base[name], a, tensors[adapter_name(name, "B")], spec.scale)


def time_shape(shape: dict, runs: int, rows: int, prompt_len: int, new_tokens: int, warmup: int,
               repeats: int) -> dict:
    spec = AdapterSpec(16, 32.0, TARGETS)
    model = random_model(shape)
    adapters = [random_adapter(model, spec, seed) for seed in range(runs)]
    targeted = {name: m.weight.detach().clone() for name, m in model.named_modules()
                if type(m) is torch.nn.Linear and name.rsplit(".", 1)[-1] in TARGETS}
    merged = copy.deepcopy(model)
    banked = copy.deepcopy(model)
    bank = AdapterBank(banked, TARGETS, slots=runs, max_rank=spec.rank)
    for slot, tensors in enumerate(adapters, start=1):
        bank.load(slot, spec, tensors)
    gen = torch.Generator().manual_seed(0)
    prompts = [[1] + torch.randint(3, shape["vocab_size"], (prompt_len - 1,), generator=gen).tolist()
               for _ in range(runs * rows)]
    seeds = list(range(len(prompts)))
    slots = [1 + i // rows for i in range(len(prompts))]
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
    common = {"eos_ids": [2], "pad_id": 0, "max_batch_size": len(prompts)}

    def tokens(results) -> int:
        return sum(len(g.token_ids) for gens in results for g in gens)

    def merged_one():
        merge_into(merged, targeted, spec, adapters[0])
        return tokens(generate_with_model(merged, prompts, params, seeds=seeds, **common))

    def bank_one():
        return tokens(generate_with_model(banked, prompts, params, seeds=seeds, bank=bank,
                                          adapter_slots=[1] * len(prompts), **common))

    def bank_mixed():
        return tokens(generate_with_model(banked, prompts, params, seeds=seeds, bank=bank, adapter_slots=slots,
                                          **common))

    def merged_in_turn():
        total = 0
        for run in range(runs):
            merge_into(merged, targeted, spec, adapters[run])
            part = slice(run * rows, (run + 1) * rows)
            total += tokens(generate_with_model(merged, prompts[part], params, seeds=seeds[part], **common))
        return total

    arms = {"merged_one": merged_one, "bank_one": bank_one, "bank_mixed": bank_mixed,
            "merged_in_turn": merged_in_turn}
    rates: dict[str, list[float]] = {name: [] for name in arms}
    for i in range(warmup + repeats):
        for name, arm in arms.items():
            start = time.perf_counter()
            n = arm()
            if i >= warmup:
                rates[name].append(n / (time.perf_counter() - start))
    tps = {name: statistics.median(r) for name, r in rates.items()}
    base_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return {
        **{f"{name}_tokens_per_s": round(tps[name], 1) for name in ARMS},
        "mixed_over_in_turn": round(tps["bank_mixed"] / tps["merged_in_turn"], 3),
        "mixed_over_one_run": round(tps["bank_mixed"] / tps["merged_one"], 3),
        "bank_one_over_merged_one": round(tps["bank_one"] / tps["merged_one"], 3),
        "base_mb": round(base_bytes / 2**20, 1),
        "bank_mb": round(bank.bytes / 2**20, 2),
        "kept_base_mb": round(sum(t.numel() * t.element_size() for t in targeted.values()) / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--rows", type=int, default=8, help="rows per run in a batch")
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    args = parser.parse_args()
    result: dict = {"runs": args.runs, "rows_per_run": args.rows, "prompt_tokens": args.prompt_tokens,
                    "new_tokens": args.new_tokens, "rank": 16, "targets": list(TARGETS),
                    "threads": torch.get_num_threads(), "repeats": args.repeats}
    for name in args.shapes:
        result[name] = time_shape(SHAPES[name], args.runs, args.rows, args.prompt_tokens, args.new_tokens,
                                  args.warmup, args.repeats)
        print(name, result[name], flush=True)
    emit("mixed_adapters", result,
         {f"{name}, {arm}": result[name][f"{arm}_tokens_per_s"] / result[name]["merged_one_tokens_per_s"]
          for name in args.shapes for arm in ARMS},
         "tokens/s, relative to one run alone (merged)",
         f"{args.runs} runs' adapters in one batch against the runs in turn: " + ", ".join(
             f"{name} {result[name]['mixed_over_in_turn']:.2f}x" for name in args.shapes))


if __name__ == "__main__":
    main()
