"""The `reasoning_gym` task: procedural reasoning prompts from the `reasoning-gym` package, scored by its own
verifiers.

One reasoning-gym composite dataset (one dataset or a weighted mixture, each with its options) seeded by
`task.reasoning_gym.seed` (`SEED_SPACING` apart) is the stream of entries: entries `[0, size)` are the training pool and entries
`[size, size + eval_size)` the held-out set, and any training entry whose question is also a held-out one is
dropped, so no held-out prompt is ever trained on. Training prompt k is pool entry `perm_e[k mod n]` of epoch
`e = k div n` (`EpochOrder`). Every process builds the same entries from the config: the entry (question,
answer, metadata) rides in the prompt's metadata to the replicas' reward workers without anything on the wire.

The reward is the entry's dataset's own `score_answer` on the answer taken from the response: the text inside
the last `<answer_tag>...</answer_tag>`, else what `fallback` names.
"""

from __future__ import annotations

import json
import re
from typing import Any

from asyncrl.core.model.tokenizer import ModelTokenizer
from asyncrl.core.tasks.base import Prompt, RewardFn, Task
from asyncrl.core.tasks.epochs import EpochOrder
from asyncrl.core.tasks.registry import register_task

SEED_SPACING = 1 << 32
"""reasoning-gym draws entry i of a dataset seeded s from Random(s + i), and seeds a mixture's datasets s + 1,
s + 2, ...: seeds k and k + 1 would give the same entries shifted by one. The task seeds the mixture with
seed x 2^32, so different seeds never share a stream."""

_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)*(?:/\d+)?")


def composite(cfg, size: int):
    """The reasoning-gym composite dataset of `cfg` (a `ReasoningGymConfig`) with `size` entries."""
    from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

    specs = [DatasetSpec(name=d.name, weight=d.weight, config=dict(d.config)) for d in cfg.datasets]
    return CompositeDataset(CompositeConfig(size=size, seed=cfg.seed * SEED_SPACING, datasets=specs))


def extract_answer(response: str, tag: str | None, fallback: str) -> str | None:
    """The answer in `response`: inside the last <tag>...</tag> when there is one, else per `fallback`
    (none: no answer; last_number: the last number; last_line: the last non-empty line; whole: all of it)."""
    if tag:
        found = re.findall(rf"<{re.escape(tag)}>\s?(.*?)\s?</{re.escape(tag)}>", response, flags=re.DOTALL)
        if found:
            return found[-1].strip()
    if fallback == "last_number":
        numbers = _NUMBER.findall(response)
        return numbers[-1].replace(",", "") if numbers else None
    if fallback == "last_line":
        lines = [line.strip() for line in response.splitlines() if line.strip()]
        return lines[-1] if lines else None
    if fallback == "whole":
        return response.strip()
    return None


class ReasoningGymTask(Task):
    name = "reasoning_gym"
    reward_name = "reasoning_gym"

    def __init__(self, task_cfg, tokenizer: ModelTokenizer | None = None):
        if tokenizer is None:
            raise ValueError("the reasoning_gym task needs the model's tokenizer (ModelTokenizer.load(model.path))")
        cfg = task_cfg.reasoning_gym
        self.cfg, self.tokenizer = cfg, tokenizer
        self.dataset = composite(cfg, cfg.size + cfg.eval_size)
        held_out = [self.dataset[i] for i in range(cfg.size, cfg.size + cfg.eval_size)]
        held_questions = {entry["question"] for entry in held_out}
        pool = [entry for entry in (self.dataset[i] for i in range(cfg.size)) if entry["question"] not in held_questions]
        if not pool:
            raise ValueError("task.reasoning_gym.size: every training entry is also a held-out one (the datasets "
                             "generate too few distinct questions; lower eval_size or widen the options)")
        self.dropped = cfg.size - len(pool)
        self._train = [self._prompt(entry) for entry in pool]
        self._eval = [self._prompt(entry) for entry in held_out]
        self._order = EpochOrder(cfg.seed, len(self._train))

    def _prompt(self, entry: dict) -> Prompt:
        content = entry["question"] + (f"\n\n{self.cfg.instruction}" if self.cfg.instruction else "")
        messages = ([{"role": "system", "content": self.cfg.system_prompt}] if self.cfg.system_prompt else []) + [
            {"role": "user", "content": content}]
        metadata = {"question": entry["question"], "answer": str(entry["answer"]), "metadata": entry["metadata"]}
        return Prompt(text=messages, token_ids=self.tokenizer.encode_prompt(messages), metadata=metadata)

    def own_reward(self) -> RewardFn:
        tag, fallback, dataset = self.cfg.answer_tag, self.cfg.fallback, self.dataset

        def reasoning_gym_score(response: str, metadata: dict[str, Any]) -> float:
            entry = {key: metadata[key] for key in ("question", "answer", "metadata")}
            if isinstance(entry["metadata"], str):  # a metadata map that went through the wire (JSON values)
                entry["metadata"] = json.loads(entry["metadata"])
            return float(dataset.score_answer(extract_answer(response, tag, fallback), entry))

        return reasoning_gym_score

    @property
    def num_train(self) -> int:
        return len(self._train)

    def train_prompt(self, index: int) -> Prompt:
        return self._train[self._order.row(index)]

    def eval_prompts(self) -> list[Prompt]:
        return list(self._eval)


register_task("reasoning_gym", ReasoningGymTask)
