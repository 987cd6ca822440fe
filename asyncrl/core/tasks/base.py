"""The task seam: a deterministic training prompt stream, a held-out evaluation set and an exact reward.

A task holds the policy's tokenizer (`ModelTokenizer`: the checkpoint's own vocabulary and chat template), so
prompts carry their token ids (engines take ids, not text) and responses decode the same way everywhere
(rollout reward, learner evaluation, warm start).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asyncrl.core.model.tokenizer import ModelTokenizer

RewardFn = Callable[[str, dict[str, Any]], float]
"""`fn(response_text, metadata) -> reward`."""


@dataclass(frozen=True)
class Prompt:
    """One prompt: its text (or chat messages), its token ids as the engines see them, and what the reward
    needs (e.g. the answer)."""

    text: str | list[dict]
    token_ids: list[int]
    metadata: dict[str, Any] = field(default_factory=dict)


class Task(ABC):
    """A prompt stream plus a reward; implementations are deterministic functions of their config."""

    name: str
    reward_name: str
    tokenizer: ModelTokenizer
    reward_fn: RewardFn
    """The reward in use: the task's own (`own_reward`) or the one the `reward` section names;
    `asyncrl.core.tasks.factory.get_task` binds it."""

    def own_reward(self) -> RewardFn | None:
        """The task's own reward (`reward.type: task`) when its scoring needs the task's state (its datasets,
        its answer format); None: the function registered under `reward_name`."""
        return None

    @abstractmethod
    def train_prompt(self, index: int) -> Prompt:
        """Prompt number `index` of the training stream (same index, same prompt, in every process)."""

    @abstractmethod
    def eval_prompts(self) -> list[Prompt]:
        """The held-out prompts; none of them ever appears in the training stream."""

    def target_text(self, prompt: Prompt) -> str:
        """The correct response text (without EOS), for supervised warm starts (synthetic tasks only)."""
        raise ValueError(f"task {self.name!r} has no supervised targets")

    def target_turns(self, prompt: Prompt) -> list[str]:
        """The correct model turns of a multi-turn episode (each ended by EOS), for warm starts against the
        environment; a single-turn task's is its target response."""
        return [self.target_text(prompt)]

    @property
    def max_response_tokens(self) -> int | None:
        """Tokens the longest correct response needs, EOS included (None: no task-specific bound)."""
        return None

    def reward(self, response_text: str, metadata: dict[str, str]) -> float:
        """Reward of one decoded response (the task's registered reward function)."""
        return float(self.reward_fn(response_text, metadata))

    def decode_response(self, token_ids: list[int]) -> str:
        """Response text: tokens up to (not including) the first EOS (`ModelTokenizer.decode_response`)."""
        return self.tokenizer.decode_response(token_ids)
