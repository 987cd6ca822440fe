"""Memory of K LoRA runs on one base against one LoRA run: the learner's and the torch engine's.

A random checkpoint of SmolLM2-135M's shape (hidden 576, 30 layers, MLP 1536, 9 query and 3 key-value heads,
vocabulary 49,152, float32) is loaded in a process of its own per case, so each peak resident memory
(`ru_maxrss`, less the process's footprint before the model) is that case's alone:
  learner_1 / learner_K : the base with 1 or K runs' adapters (rank 16 on every attention and MLP projection,
                          peft, `learner.adapters`), a `Trainer` per run (its own AdamW), `--steps` steps of each
                          run on a batch of `--batch` sequences of 64 tokens, interleaved, and the push's copy of
                          each run's adapter; `_trimmed`: the same with glibc's heap trimmed after each
                          step (`malloc_trim`: one run's freed activations otherwise stay in the heap, cut
                          up, and the next run's step takes more);
  engine_merged_1       : the torch engine's LoRA run today (`MergedAdapter`): the base, its kept copy of the
                          targeted weights and the spare set a push merges into, after two pushes;
  engine_bank_K         : the base with an adapter bank (`asyncrl.core.lora.row_adapters`) of 2 slots per run
                          (the live adapter and the next push's), K adapters loaded, one mixed batch decoded.
The ratios are K runs over one; four separate deployments would hold K times one.

    .venv/bin/python bench/shared_base_memory.py [--runs 4] [--steps 2] [--batch 8]
    (or: asyncrl bench shared_base_memory)
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import resource
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch
from common import emit, random_adapter, train_batch

MIB = 1 << 20
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK = 16
SMOLLM2 = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
           "num_attention_heads": 9, "num_key_value_heads": 3}


def smollm2_shaped(out_dir: Path) -> Path:
    """SmolLM2-135M's shape with random weights (seed 0), saved once."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if not (out_dir / "config.json").exists():
        torch.manual_seed(0)
        cfg = Qwen2Config(**SMOLLM2, head_dim=64, max_position_embeddings=512, tie_word_embeddings=False,
                          pad_token_id=0, eos_token_id=2, bos_token_id=1)
        Qwen2ForCausalLM(cfg).save_pretrained(str(out_dir), safe_serialization=True)
    return out_dir


def measure(case: str, runs: int, trim: bool, model_dir: str, args, out) -> None:
    import transformers  # noqa: F401 - loaded before the footprint is read

    from asyncrl.core.model.modeling import load_causal_lm

    torch.set_num_threads(2)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    model = load_causal_lm(model_dir)
    cases = {"learner": learner_case, "engine_merged": merged_case, "engine_bank": bank_case}
    held = cases[case](model, runs, args, trim)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out.put({"peak_mib": round((peak - before) / MIB, 1), "tensors_mib": round(held / MIB, 1)})


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def learner_case(model, runs: int, args, trim: bool) -> int:
    from asyncrl.core.config.schema import LearnerConfig, SamplingConfig
    from asyncrl.core.model.sampling import SamplingParams
    from asyncrl.learner.adapters import inject_adapters, lora_parameters, run_active
    from asyncrl.learner.trainer import Trainer

    trainers = {}
    for i in range(runs):
        run = f"run{i}"
        cfg = LearnerConfig.model_validate({"lr": 1e-4, "algo": {"preset": "decoupled_token_is"}, "lora": {
            "enabled": True, "rank": RANK, "alpha": 2.0 * RANK, "target_modules": TARGETS}})
        inject_adapters(model, cfg.lora, run)
        with run_active(model, run):
            trainers[run] = Trainer(model, cfg, SamplingParams.from_config(SamplingConfig()), pad_id=0)
    batch = train_batch(args.batch, 32, 32, model.config.vocab_size)
    libc = ctypes.CDLL("libc.so.6") if trim else None
    for step in range(args.steps):
        for run, trainer in trainers.items():
            with run_active(model, run):
                trainer.step(batch, version=step + 1)
            if libc is not None:  # the step's freed activations back to the system, not kept in glibc's heap
                libc.malloc_trim(0)
    copies = [p.detach().clone() for run in trainers for _, p in lora_parameters(model, run)]  # the pushes' copies
    optimizer = [t for tr in trainers.values() for state in tr.optimizer.state.values()
                 for t in state.values() if torch.is_tensor(t)]
    return tensor_bytes(model.parameters()) + tensor_bytes(optimizer) + tensor_bytes(copies)


def merged_case(model, runs: int, args, trim: bool) -> int:
    from asyncrl.core.engines.merged_adapter import MergedAdapter
    from asyncrl.core.lora.spec import AdapterSpec
    from asyncrl.core.model.modeling import weight_slots

    spec = AdapterSpec(RANK, 2.0 * RANK, tuple(TARGETS))
    slots = weight_slots(model)
    served = MergedAdapter(slots)
    plan = SimpleNamespace(tensors=[SimpleNamespace(name=n, shape=tuple(t.shape)) for n, t in
                                    random_adapter(model, spec, 0).items()], adapter=spec, push_id="bench")
    layers = served.layers(plan)
    for version in (1, 2):  # the second push merges into the spares the first one left
        served.swap_in(served.merge(plan, layers, random_adapter(model, spec, version)), f"v{version}")
    return tensor_bytes(model.parameters()) + tensor_bytes(served._base.values()) + tensor_bytes(served._spare.values())


def bank_case(model, runs: int, args, trim: bool) -> int:
    from asyncrl.core.engines.torch_decode import generate_with_model
    from asyncrl.core.lora.row_adapters import AdapterBank
    from asyncrl.core.lora.spec import AdapterSpec
    from asyncrl.core.model.sampling import SamplingParams

    spec = AdapterSpec(RANK, 2.0 * RANK, tuple(TARGETS))
    adapters = [random_adapter(model, spec, run) for run in range(runs)]
    bank = AdapterBank(model, TARGETS, slots=2 * runs, max_rank=RANK)
    for run, tensors in enumerate(adapters):
        bank.load(1 + run, spec, tensors)
    prompts = [[1] + list(range(3, 34)) for _ in range(args.batch)]
    generate_with_model(model, prompts, SamplingParams(temperature=1.0, max_new_tokens=8), eos_ids=[2], pad_id=0,
                        bank=bank, adapter_slots=[1 + i % runs for i in range(len(prompts))])
    return tensor_bytes(model.parameters()) + bank.bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    model_dir = smollm2_shaped(Path(tempfile.gettempdir()) / "asyncrl-bench-smollm2-shape")
    ctx = mp.get_context("spawn")
    k = args.runs
    cases = {"learner_1": ("learner", 1, False), f"learner_{k}": ("learner", k, False),
             "learner_1_trimmed": ("learner", 1, True), f"learner_{k}_trimmed": ("learner", k, True),
             "engine_merged_1": ("engine_merged", 1, False), "engine_bank_1": ("engine_bank", 1, False),
             f"engine_bank_{k}": ("engine_bank", k, False)}
    results = {}
    for name, (case, runs, trim) in cases.items():
        out = ctx.Queue()
        proc = ctx.Process(target=measure, args=(case, runs, trim, str(model_dir), args, out))
        proc.start()
        results[name] = out.get()
        proc.join()
        print(name, results[name], flush=True)
    ratios = {"learner_ratio": results[f"learner_{k}"]["peak_mib"] / results["learner_1"]["peak_mib"],
              "learner_ratio_trimmed": results[f"learner_{k}_trimmed"]["peak_mib"] / results["learner_1_trimmed"]["peak_mib"],
              "engine_ratio": results[f"engine_bank_{k}"]["peak_mib"] / results["engine_merged_1"]["peak_mib"],
              "engine_ratio_same_engine": results[f"engine_bank_{k}"]["peak_mib"] / results["engine_bank_1"]["peak_mib"]}
    emit("shared_base_memory", {
        "model": "SmolLM2-135M shape, random weights, float32", "runs": k, "rank": RANK, "targets": TARGETS,
        "batch": args.batch, "steps": args.steps, "cases": results, **{n: round(r, 3) for n, r in ratios.items()},
    }, {name: r["peak_mib"] for name, r in results.items()}, "peak MiB over the process's footprint",
        f"{k} runs on one base: learner {ratios['learner_ratio']:.2f}x ({ratios['learner_ratio_trimmed']:.2f}x "
        f"trimmed), torch engine "
        f"{ratios['engine_ratio']:.2f}x one LoRA run (merged)")


if __name__ == "__main__":
    main()
