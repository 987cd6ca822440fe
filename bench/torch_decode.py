"""What each part of the torch engine's decode buys at the real-model example's size, same run.

SmolLM2-135M-Instruct (float32, one thread, as the example's replica and learner run it) on the example's own
prompts (examples/smollm2-arithmetic.yaml: reasoning-gym sums under SmolLM2's chat template, about 53 tokens
of which the system turn's 20 are the same in every prompt), two workloads:
- `rollout`: one replica batch, 4 prompts x 8 samples, temperature 1, 24 new tokens;
- `evaluation`: the 100 held-out prompts, greedy, 24 new tokens (batches of 64, as the learner evaluates).
Arms, alternating: everything on; each part off alone; everything off (the decode before these parts):
- `sampling`: one uniform a row and a search of its cumulative sum, against `torch.multinomial` (an
  exponential drawn for every vocabulary entry);
- `gqa`: grouped-query attention with the key heads in place (`asyncrl.core.model.attention`), against
  transformers' "sdpa", which copies them to the query heads' count;
- `head`: the prompts' common head (the system turn) prefilled once;
- `drop`: finished rows leave the batch (`torch_decode.DROP_FINISHED_AT`).
Each arm's figure is the median of `--repeats` runs after a warm-up.

    .venv/bin/python bench/torch_decode.py [--repeats 3]
    results: docs/results/torch_decode.json and .png
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path

import torch
from common import emit
from real_model import EXAMPLE, fetch_model

REPO = Path(__file__).resolve().parents[1]
PARTS = ("sampling", "gqa", "head", "drop")


def _multinomial(logits, params, generator=None, row_generators=None):
    from asyncrl.core.model.sampling import processed_logprobs

    logp = processed_logprobs(logits, params)
    if params.greedy:
        tokens = torch.argmax(logp, dim=-1)
    else:
        tokens = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


@contextlib.contextmanager
def parts_off(off: set[str]):
    """The decode with the parts in `off` switched back to what stood before them."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from asyncrl.core.engines import torch_decode
    from asyncrl.core.model import attention

    saved = torch_decode.sample_tokens, torch_decode.shared_head, torch_decode.DROP_FINISHED_AT
    if "sampling" in off:
        torch_decode.sample_tokens = _multinomial
    if "head" in off:
        torch_decode.shared_head = lambda model, prompts: 0
    if "drop" in off:
        torch_decode.DROP_FINISHED_AT = 2.0  # never
    if "gqa" in off:
        AttentionInterface.register("sdpa", sdpa_attention_forward)
    try:
        yield
    finally:
        torch_decode.sample_tokens, torch_decode.shared_head, torch_decode.DROP_FINISHED_AT = saved
        AttentionInterface.register("sdpa", attention._sdpa)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    fetch_model()

    from asyncrl.core.config.file import load_config
    from asyncrl.core.engines.torch_decode import generate_with_model
    from asyncrl.core.model.modeling import eos_token_ids, load_causal_lm, pad_token_id
    from asyncrl.core.model.sampling import SamplingParams
    from asyncrl.core.tasks import task_for_run

    torch.set_num_threads(1)
    config = load_config(REPO / "examples" / f"{EXAMPLE}.yaml", [])
    task = task_for_run(config)
    model = load_causal_lm(REPO / config.model.path)
    model.requires_grad_(False)  # as the engine holds it
    eos, pad = eos_token_ids(model), pad_token_id(model)
    new_tokens = config.sampling.max_new_tokens
    workloads = {
        "rollout": ([task.train_prompt(i).token_ids for i in range(4)], config.sampling.group_size,
                    SamplingParams(temperature=config.sampling.temperature, max_new_tokens=new_tokens)),
        "evaluation": ([p.token_ids for p in task.eval_prompts()], 1,
                       SamplingParams(max_new_tokens=new_tokens, greedy=True)),
    }
    arms = {"all on": set(), **{f"{part} off": {part} for part in PARTS}, "all off": set(PARTS)}
    seconds: dict[str, dict[str, list[float]]] = {w: {arm: [] for arm in arms} for w in workloads}
    tokens: dict[str, dict[str, int]] = {w: {} for w in workloads}
    for repeat in range(args.repeats + 1):
        for arm, off in arms.items():
            with parts_off(off):
                for name, (prompts, n, params) in workloads.items():
                    t0 = time.perf_counter()
                    out = generate_with_model(model, prompts, params, n, eos_ids=eos, pad_id=pad,
                                              generator=torch.Generator().manual_seed(repeat))
                    if repeat:  # the first round warms up
                        seconds[name][arm].append(time.perf_counter() - t0)
                    tokens[name][arm] = sum(len(g.token_ids) for group in out for g in group)
        print(repeat, {w: {a: s[-1] for a, s in arms_s.items() if s} for w, arms_s in seconds.items()}, flush=True)
    result = {"model": config.model.path, "threads": 1, "dtype": "float32", "repeats": args.repeats,
              "workloads": {name: {"prompts": len(prompts), "samples_per_prompt": n,
                                   "max_new_tokens": new_tokens, "greedy": params.greedy}
                            for name, (prompts, n, params) in workloads.items()}}
    for name in workloads:
        median = {arm: statistics.median(s) for arm, s in seconds[name].items()}
        result[name] = {
            "seconds": {arm: round(m, 3) for arm, m in median.items()},
            "all_on_over_all_off": round(median["all on"] / median["all off"], 3),
            # What each part buys: the time with it off over the time with everything on.
            "part_off_over_all_on": {part: round(median[f"{part} off"] / median["all on"], 3) for part in PARTS},
            "greedy_tokens_equal": (len(set(tokens[name].values())) == 1) if name == "evaluation" else None,
            "runs": {arm: [round(x, 3) for x in s] for arm, s in seconds[name].items()},
        }
    emit("torch_decode", result,
         {f"{name}: {arm}": result[name]["seconds"][arm] for name in workloads for arm in ("all off", "all on")},
         "seconds", "SmolLM2-135M-Instruct decode, one thread: 4 x 8 samples (rollout), 100 prompts greedy "
         "(evaluation), before and with the decode's parts")


if __name__ == "__main__":
    main()
