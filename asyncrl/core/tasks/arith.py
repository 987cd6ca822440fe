"""The `arith` task: multi-digit addition, prompt "12+34=", answer "46" then EOS.

Operands are uniform in [0, 10**num_digits). The held-out set is the first `eval_size` distinct operand pairs
of its own seeded stream; the training stream redraws any pair that is in the held-out set, so training never
sees an evaluation prompt. Both streams are pure functions of (seed, index): every replica and the learner
agree on prompt `index` without talking to each other.
"""

from __future__ import annotations

import numpy as np

from asyncrl.core.tasks.base import Prompt, Task
from asyncrl.core.tasks.registry import register_reward, register_task
from asyncrl.core.tokenizer import EOS, ModelTokenizer

# Sub-streams of the seeded generator, so eval and train draws never share random numbers.
_EVAL_STREAM, _TRAIN_STREAM = 0, 1


def arith_exact(response_text, metadata) -> float:
    """1.0 when the response is exactly the expected answer (surrounding whitespace and a trailing EOS
    marker aside), else 0.0. Anything malformed (None, bytes, missing answer) scores 0.0."""
    if not isinstance(response_text, str) or not isinstance(metadata, dict):
        return 0.0
    answer = metadata.get("answer")
    if not isinstance(answer, str) or not answer:
        return 0.0
    text = response_text.strip()
    if text.endswith(EOS):
        text = text[: -len(EOS)].strip()
    return 1.0 if text == answer else 0.0


class ArithTask(Task):
    name = "arith"
    reward_name = "arith_exact"

    def __init__(self, task_cfg, tokenizer: ModelTokenizer | None = None):
        self.num_digits = int(task_cfg.num_digits)
        self.eval_size = int(task_cfg.eval_size)
        self.seed = int(task_cfg.seed)
        self.tokenizer = tokenizer or ModelTokenizer.arith()
        self._limit = 10**self.num_digits
        total = self._limit**2
        if self.eval_size > total // 2:
            raise ValueError(
                f"task.eval_size={self.eval_size} leaves too few training prompts: {self.num_digits}-digit "
                f"addition has only {total} operand pairs (use at most {total // 2})"
            )
        self._eval_pairs = self._draw_eval_pairs()
        self._eval_set = frozenset(self._eval_pairs)

    def _draw_eval_pairs(self) -> list[tuple[int, int]]:
        rng = np.random.default_rng([self.seed, _EVAL_STREAM])
        pairs: list[tuple[int, int]] = []
        seen: set[tuple[int, int]] = set()
        while len(pairs) < self.eval_size:
            a, b = (int(x) for x in rng.integers(0, self._limit, size=2))
            if (a, b) not in seen:
                seen.add((a, b))
                pairs.append((a, b))
        return pairs

    def _prompt(self, a: int, b: int) -> Prompt:
        text = f"{a}+{b}="
        return Prompt(text=text, token_ids=self.tokenizer.encode_prompt(text), metadata={"answer": str(a + b)})

    def train_pair(self, index: int) -> tuple[int, int]:
        """Operands of training prompt `index`."""
        if index < 0:
            raise ValueError(f"prompt index must be >= 0, got {index}")
        rng = np.random.default_rng([self.seed, _TRAIN_STREAM, index])
        while True:
            a, b = (int(x) for x in rng.integers(0, self._limit, size=2))
            if (a, b) not in self._eval_set:
                return a, b

    def train_prompt(self, index: int) -> Prompt:
        return self._prompt(*self.train_pair(index))

    def eval_prompts(self) -> list[Prompt]:
        return [self._prompt(a, b) for a, b in self._eval_pairs]

    def target_text(self, prompt: Prompt) -> str:
        return prompt.metadata["answer"]

    @property
    def max_response_tokens(self) -> int:
        # The sum of two n-digit numbers has at most n+1 digits, plus EOS.
        return self.num_digits + 2


register_task("arith", ArithTask)
register_reward("arith_exact", arith_exact)
