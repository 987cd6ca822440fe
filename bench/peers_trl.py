"""TRL's `GRPOTrainer` on the prompts `bench/peers.py` wrote: the peer's side of that bench. It runs in TRL's own
virtual environment (`bench/peers.py` makes it), so it imports nothing of asyncrl. Prints one JSON line: when
each step ended (unix seconds, the launcher's clock); the final policy is saved to `--out` for the launcher to
evaluate.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    data = json.loads(Path(args.data).read_text())
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(Path(args.model) / "tokenizer.json"), bos_token="<bos>",
                                        eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    dataset = Dataset.from_dict({"prompt": data["prompts"], "answer": data["answers"]})

    def exact_match(completions, answer, **_):
        return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

    ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *_args, **_kwargs):
            ends.append(time.time())

    config = GRPOConfig(
        output_dir=args.out, learning_rate=data["lr"], lr_scheduler_type="constant", warmup_steps=0,
        per_device_train_batch_size=data["batch_size"], num_generations=data["group_size"],
        max_completion_length=data["max_new_tokens"], temperature=1.0, beta=0.0, epsilon=0.2, loss_type="dapo",
        max_steps=args.steps, logging_steps=10, save_strategy="no", report_to="none", use_cpu=True, seed=args.seed,
        shuffle_dataset=False, max_grad_norm=1.0, weight_decay=0.0, disable_dropout=True,
        bf16=False,  # float32, as asyncrl trains: TRL's default autocasts to bfloat16
    )  # fmt: skip
    trainer = GRPOTrainer(model=model, reward_funcs=exact_match, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Clock()])
    trainer.train()
    trainer.save_model(str(Path(args.out) / "final"))
    print(json.dumps({"step_ends": ends}))


if __name__ == "__main__":
    main()
