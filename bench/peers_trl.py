"""TRL's `GRPOTrainer` on the prompts `bench/peers.py` (or `bench/peers_real.py`) wrote: the peer's side of those
benches. It runs in TRL's own virtual environment (`bench/peers.py` makes it), so it imports nothing of asyncrl.
Prints one JSON line: when each step ended and how long each save took (unix seconds, the launcher's clock);
the final policy is saved to `--out` (and every `save_every` steps to `--out/step-N`) for the launcher to
evaluate.

The data file says what to train on: `prompts` (strings, or chat message lists rendered by the model's own
template), `answers`, and `reward`: `exact` (the response equals the answer) or `reasoning_gym` (the answer
in the last <answer> tags, else the last number, scored as reasoning-gym's default `score_answer` does:
1 when equal, len(answer)/len(extracted) when the answer is inside it).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

NUMBER = re.compile(r"-?\d+(?:[.,]\d+)*(?:/\d+)?")


def reasoning_gym_score(completion: str, answer: str) -> float:
    """asyncrl's reasoning_gym reward with `answer_tag: answer, fallback: last_number`, for a dataset that keeps
    reasoning-gym's default `score_answer`."""
    tagged = re.findall(r"<answer>\s?(.*?)\s?</answer>", completion, flags=re.DOTALL)
    if tagged:
        extracted = tagged[-1].strip()
    else:
        numbers = NUMBER.findall(completion)
        extracted = numbers[-1].replace(",", "") if numbers else None
    if not extracted:
        return 0.0
    if extracted == answer:
        return 1.0
    return len(answer) / len(extracted) if answer in extracted else 0.0


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
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    data = json.loads(Path(args.data).read_text())
    if data.get("reward", "exact") == "exact":  # the tiny demo: its character tokenizer as written
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(Path(args.model) / "tokenizer.json"),
                                            bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    else:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    dataset = Dataset.from_dict({"prompt": data["prompts"], "answer": data["answers"]})

    def completion_text(completion) -> str:
        return completion if isinstance(completion, str) else completion[-1]["content"]  # a chat completion

    def reward(completions, answer, **_):
        texts = [completion_text(c) for c in completions]
        if data.get("reward", "exact") == "exact":
            return [1.0 if t.strip() == a else 0.0 for t, a in zip(texts, answer)]
        return [reasoning_gym_score(t, a) for t, a in zip(texts, answer)]

    ends: list[float] = []
    saves: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, _control, **kwargs):
            ends.append(time.time())
            every = data.get("save_every", 0)
            if every and state.global_step % every == 0 and state.global_step < args.steps:
                t0 = time.time()
                kwargs["model"].save_pretrained(str(Path(args.out) / f"step-{state.global_step}"))
                tokenizer.save_pretrained(str(Path(args.out) / f"step-{state.global_step}"))
                saves.append(time.time() - t0)

    config = GRPOConfig(
        output_dir=args.out, learning_rate=data["lr"], lr_scheduler_type="constant", warmup_steps=0,
        per_device_train_batch_size=data["batch_size"], num_generations=data["group_size"],
        max_completion_length=data["max_new_tokens"], temperature=data.get("temperature", 1.0), beta=0.0, epsilon=0.2, loss_type="dapo",
        max_steps=args.steps, logging_steps=10, save_strategy="no", report_to="none", use_cpu=True, seed=args.seed,
        shuffle_dataset=False, max_grad_norm=1.0, weight_decay=0.0, disable_dropout=True,
        bf16=data.get("bf16", False),  # float32 unless asked: TRL's own default autocasts to bfloat16
    )  # fmt: skip
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Clock()])
    trainer.train()
    trainer.save_model(str(Path(args.out) / "final"))
    print(json.dumps({"step_ends": ends, "save_s": saves}))


if __name__ == "__main__":
    main()
