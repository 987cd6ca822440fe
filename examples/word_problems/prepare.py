"""Make the word-problems example's data and tokenizer (deterministic; the outputs are committed beside this
file, so running it again only reproduces them).

- `data/train.jsonl`, `data/eval.jsonl`: one row per problem, the prompt as chat messages, the answer as a
  string, the operation as extra metadata. The held-out problems' (template, a, b) never occur in training.
- `tokenizer/`: a byte-level BPE tokenizer (digits split one per token) trained with `tokenizers` on the
  rendered conversations, saved in Hugging Face format with a ChatML-style chat template; `<|im_end|>` ends
  an answer.

    .venv/bin/python examples/word_problems/prepare.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

HERE = Path(__file__).parent
NAMES = ["Ada", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea", "Max", "Nia"]
ITEMS = ["apple", "book", "coin", "card", "shell", "stamp", "marble", "pencil", "cookie", "sticker"]
TEMPLATES = [
    ("add", "{name} has {a} {item}s and gets {b} more. How many {item}s does {name} have now?"),
    ("add", "There are {a} {item}s in a box and {b} {item}s in a bag. How many {item}s are there in total?"),
    ("sub", "{name} had {a} {item}s and gave away {b}. How many {item}s are left?"),
    ("sub", "A shelf held {a} {item}s. {name} took {b} of them. How many {item}s are still on the shelf?"),
]
MAX_OPERAND = 20
TRAIN_ROWS, EVAL_ROWS = 4000, 200
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def problem(rng: random.Random, template_index: int, a: int, b: int) -> dict:
    op, text = TEMPLATES[template_index]
    if op == "sub" and b > a:
        a, b = b, a
    question = text.format(name=rng.choice(NAMES), item=rng.choice(ITEMS), a=a, b=b)
    answer = a + b if op == "add" else a - b
    return {"messages": [{"role": "user", "content": question}], "answer": str(answer), "operation": op}


def make_rows() -> tuple[list[dict], list[dict]]:
    rng = random.Random(0)
    keys = [(t, a, b) for t in range(len(TEMPLATES)) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]
    rng.shuffle(keys)
    held_out, rest = keys[:EVAL_ROWS], keys[EVAL_ROWS:]
    train = [problem(rng, *rng.choice(rest)) for _ in range(TRAIN_ROWS)]
    return train, [problem(rng, *key) for key in held_out]


def train_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=128
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def main() -> None:
    train, held_out = make_rows()
    (HERE / "data").mkdir(exist_ok=True)
    for name, rows in (("train", train), ("eval", held_out)):
        with (HERE / "data" / f"{name}.jsonl").open("w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    rendered = [
        f"<|im_start|>user\n{row['messages'][0]['content']}<|im_end|>\n<|im_start|>assistant\n{row['answer']}<|im_end|>\n"
        for row in train
    ]
    tokenizer = train_tokenizer(rendered)
    tokenizer.save_pretrained(str(HERE / "tokenizer"))
    print(f"{len(train)} training and {len(held_out)} held-out problems; vocabulary {len(tokenizer)}")


if __name__ == "__main__":
    main()
