"""The task seam: a deterministic training prompt stream, a held-out evaluation set and an exact reward.

A task owns its tokenizer codec, so prompts carry their token ids (engines take ids, not text) and responses
decode the same way everywhere (rollout reward, learner evaluation, warm start).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from asyncrl.core.tokenizer import TextCodec

RewardFn = Callable[[str, dict[str, str]], float]
"""`fn(response_text, metadata) -> reward`."""


@dataclass(frozen=True)
class Prompt:
    """One prompt: its text, its token ids (with <bos>), and what the reward needs (e.g. the answer)."""

    text: str
    token_ids: list[int]
    metadata: dict[str, str] = field(default_factory=dict)


class Task(ABC):
    """A prompt stream plus a reward; implementations are deterministic functions of their config."""

    name: str
    reward_name: str
    codec: TextCodec
    reward_fn: RewardFn
    """The function registered under `reward_name`; `asyncrl.core.tasks.factory.get_task` binds it."""

    @abstractmethod
    def train_prompt(self, index: int) -> Prompt:
        """Prompt number `index` of the training stream (same index, same prompt, in every process)."""

    @abstractmethod
    def eval_prompts(self) -> list[Prompt]:
        """The held-out prompts; none of them ever appears in the training stream."""

    @abstractmethod
    def target_text(self, prompt: Prompt) -> str:
        """The correct response text (without EOS), for supervised warm starts."""

    @property
    @abstractmethod
    def max_response_tokens(self) -> int:
        """Tokens the longest correct response needs, EOS included."""

    def reward(self, response_text: str, metadata: dict[str, str]) -> float:
        """Reward of one decoded response (the task's registered reward function)."""
        return float(self.reward_fn(response_text, metadata))

    def decode_response(self, token_ids: list[int]) -> str:
        """Response text: tokens up to (not including) the first EOS.

        Other special tokens are kept as text on purpose, so a response with junk specials in it cannot
        pass an exact-match reward.
        """
        ids = list(token_ids)
        if self.codec.eos_id in ids:
            ids = ids[: ids.index(self.codec.eos_id)]
        return self.codec.tokenizer.decode(ids, skip_special_tokens=False)
