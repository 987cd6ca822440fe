"""The `arith` task: multi-digit addition, prompt "12+34=", answer "46" then EOS (`num_terms` operands).

Operands are uniform in [0, 10**num_digits). The held-out set is the first `eval_size` distinct operand tuples
of its own seeded stream; the training stream redraws any tuple that is in the held-out set, so training never
sees an evaluation prompt. Both streams are pure functions of (seed, index): every replica and the learner
agree on prompt `index` without talking to each other.
"""

from __future__ import annotations

import numpy as np

from asyncrl.core.model.tokenizer import ARITH_ALPHABET, EOS, ModelTokenizer
from asyncrl.core.tasks.base import Prompt, Task
from asyncrl.core.tasks.registry import register_reward, register_task

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
    CHAR_TOKENIZER: tuple = (ARITH_ALPHABET, (), None)
    """(alphabet, extra special tokens, chat template) of the character tokenizer the tiny model is built with."""

    def __init__(self, task_cfg, tokenizer: ModelTokenizer | None = None):
        self.num_digits = int(task_cfg.num_digits)
        self.num_terms = int(task_cfg.num_terms)
        self.eval_size = int(task_cfg.eval_size)
        self.seed = int(task_cfg.seed)
        self.tokenizer = tokenizer or ModelTokenizer.arith()
        self._limit = 10**self.num_digits
        total = self._limit**self.num_terms
        if self.eval_size > total // 2:
            raise ValueError(
                f"task.eval_size={self.eval_size} leaves too few training prompts: {self.num_digits}-digit "
                f"addition of {self.num_terms} terms has only {total} operand tuples (use at most {total // 2})"
            )
        self._eval_pairs = self._draw_eval_pairs()
        self._eval_set = frozenset(self._eval_pairs)

    def _draw_eval_pairs(self) -> list[tuple[int, ...]]:
        rng = np.random.default_rng([self.seed, _EVAL_STREAM])
        pairs: list[tuple[int, ...]] = []
        seen: set[tuple[int, ...]] = set()
        while len(pairs) < self.eval_size:
            terms = tuple(int(x) for x in rng.integers(0, self._limit, size=self.num_terms))
            if terms not in seen:
                seen.add(terms)
                pairs.append(terms)
        return pairs

    def _prompt(self, *terms: int) -> Prompt:
        text = "+".join(map(str, terms)) + "="
        return Prompt(text=text, token_ids=self.tokenizer.encode_prompt(text), metadata={"answer": str(sum(terms))})

    def train_pair(self, index: int) -> tuple[int, ...]:
        """Operands of training prompt `index`."""
        if index < 0:
            raise ValueError(f"prompt index must be >= 0, got {index}")
        rng = np.random.default_rng([self.seed, _TRAIN_STREAM, index])
        while True:
            terms = tuple(int(x) for x in rng.integers(0, self._limit, size=self.num_terms))
            if terms not in self._eval_set:
                return terms

    def train_prompt(self, index: int) -> Prompt:
        return self._prompt(*self.train_pair(index))

    def eval_prompts(self) -> list[Prompt]:
        return [self._prompt(*terms) for terms in self._eval_pairs]

    def target_text(self, prompt: Prompt) -> str:
        return prompt.metadata["answer"]

    @property
    def max_response_tokens(self) -> int:
        # The sum of k numbers below 10**n is below k * 10**n: at most n + len(str(k - 1)) digits, plus EOS.
        return self.num_digits + len(str(self.num_terms)) + 1


register_task("arith", ArithTask)
register_reward("arith_exact", arith_exact)
