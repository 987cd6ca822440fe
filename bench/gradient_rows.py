"""What the rows without gradient cost (`learner/gradient_rows.py`), three ways in one run.

The learner's `Trainer.step` on the real-model example's shape (SmolLM2-135M-Instruct, 4 groups of 8, a
48-token prompt shared by each group, 24-token responses, float32, one thread), with a given share of the
groups uniform (every reward equal: zero advantage): those rows not forwarded at all (`skipped`,
`Trainer.skips_rows`, the default where nothing rejects), forwarded under no_grad (`split`,
`Trainer.splits_rows`), and one forward of the whole batch with gradient (`whole`). The arms alternate step by
step; each reports the median of its steps after one warm-up step. The example's runs have 38-45% of their
sequences in such groups.

    .venv/bin/python bench/gradient_rows.py [--model-path artifacts/smollm2-135m-instruct] [--repeats 4]
        [--uniform 0,1,2] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import emit, train_batch

GROUPS, GROUP_SIZE, PROMPT, RESPONSE = 4, 8, 48, 24


def example_batch(vocab: int, uniform_groups: int):
    """The example's batch shape with random tokens: groups below `uniform_groups` all rewarded 0, the others
    mixed."""
    n = GROUPS * GROUP_SIZE
    rewards = [0.0 if r // GROUP_SIZE < uniform_groups else float(r % 3 == 0) for r in range(n)]
    return train_batch(n, PROMPT, RESPONSE, vocab, group=GROUP_SIZE, shared_prompts=True, rewards=rewards)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default="artifacts/smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--uniform", default="0,1,2", help="uniform groups of the 4, one arm pair each")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    from asyncrl.core.config.schema import LearnerConfig, SamplingConfig
    from asyncrl.core.model.modeling import load_causal_lm
    from asyncrl.core.model.sampling import SamplingParams
    from asyncrl.learner.trainer import Trainer

    torch.set_num_threads(args.threads)
    model = load_causal_lm(args.model_path)
    cfg = LearnerConfig.model_validate({"lr": 1e-6, "algo": {"preset": "decoupled_token_is"}})
    trainer = Trainer(model, cfg, SamplingParams.from_config(SamplingConfig()), pad_id=0)
    arms = {"skipped": (True, True), "split": (True, False), "whole": (False, False)}
    rows = {}
    for uniform in (int(u) for u in args.uniform.split(",")):
        batch = example_batch(model.config.vocab_size, uniform)
        seconds: dict[str, list[float]] = {arm: [] for arm in arms}
        for i in range(args.repeats + 1):
            for arm, (split, skip) in arms.items():
                trainer.splits_rows, trainer.skips_rows = split, skip
                t0 = time.perf_counter()
                metrics = trainer.step(batch, version=1)
                if i:  # the first of each is a warm-up
                    seconds[arm].append(time.perf_counter() - t0)
                if split:
                    free = metrics["batch/gradient_free_sequences"]
        median = {arm: statistics.median(s) for arm, s in seconds.items()}
        rows[f"{uniform} of {GROUPS} groups uniform"] = {
            "gradient_free_sequences": free, **{f"{arm}_s": round(m, 3) for arm, m in median.items()},
            "skipped_over_whole": round(median["skipped"] / median["whole"], 3),
            "split_over_whole": round(median["split"] / median["whole"], 3),
            "skipped_over_split": round(median["skipped"] / median["split"], 3),
            "steps": {arm: [round(x, 3) for x in s] for arm, s in seconds.items()}}
        print(uniform, rows[f"{uniform} of {GROUPS} groups uniform"], flush=True)
    emit("gradient_rows", {"model": args.model_path, "threads": args.threads, "arms": rows},
         {f"{k}: {arm}": v[f"{arm}_s"] for k, v in rows.items() for arm in arms}, "seconds per step",
         "learner step: rows without gradient not forwarded (skipped), forwarded under no_grad (split), "
         "or with the rest (whole)")


if __name__ == "__main__":
    main()
