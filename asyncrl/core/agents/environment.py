"""The environment seam: an episode starts from a prompt, then each model turn is an action the environment
answers with an observation (chat messages), a reward and whether the episode is done.

Calls are synchronous and may be slow (a tool, a sandbox, a server): the runner makes them on worker threads
beside generation, with a time limit, so an environment never blocks the engine. `start` and `step` may raise,
hang or return garbage; the runner ends that episode with a reason and goes on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from asyncrl.core.tasks.base import Prompt


@dataclass(frozen=True)
class ToolOutcome:
    """One tool call of a step, for the metrics (calls and failures by tool)."""

    tool: str
    ok: bool


@dataclass(frozen=True, kw_only=True)
class StepResult:
    messages: list[dict]
    """The observation: chat messages (`{"role": "tool" | "user", "content": str}`) rendered with the model's
    chat template after its turn ([] when the episode is done)."""
    reward: float = 0.0
    """Reward of the model turn that this step answered (the episode's reward is the sum)."""
    done: bool = False
    tools: tuple[ToolOutcome, ...] = field(default_factory=tuple)


class Session(ABC):
    """One episode's side of the environment."""

    opening: list[dict] | tuple = ()
    """Messages the environment shows after the prompt before the model's first turn (an OpenEnv reset
    observation); empty: the prompt alone."""

    @abstractmethod
    def step(self, action: str) -> StepResult:
        """Answer the model's turn `action` (its text, special tokens kept)."""

    def close(self) -> None:
        """Release what the episode holds (called once, whatever the way it ended)."""


class Environment(ABC):
    tools: tuple[dict, ...] | list[dict] = ()
    """JSON schemas of the functions the model may call, handed to the chat template (empty: none)."""

    @abstractmethod
    def start(self, prompt: Prompt) -> Session:
        """A new episode on `prompt` (its messages are the first observation)."""

    def close(self) -> None:
        """Release the environment (servers, pools)."""


class EnvironmentFault(RuntimeError):
    """An environment answered something that is not a StepResult it may give; ends the episode."""


def checked(result) -> StepResult:
    """`result` if it is a well-formed StepResult; EnvironmentFault naming what is wrong otherwise."""
    if not isinstance(result, StepResult):
        raise EnvironmentFault(f"step returned {type(result).__name__}, not a StepResult")
    if not isinstance(result.reward, (int, float)) or result.reward != result.reward or abs(result.reward) == float("inf"):
        raise EnvironmentFault(f"step returned reward {result.reward!r}, not a finite number")
    checked_messages(result.messages, "step")
    if not result.done and not result.messages:
        raise EnvironmentFault("step returned no observation for an episode that is not done")
    return result


def checked_messages(messages, where: str) -> list[dict]:
    """`messages` if they are a list of {role: str, content: str}; EnvironmentFault saying `where` otherwise."""
    if not isinstance(messages, (list, tuple)) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages):
        raise EnvironmentFault(f"{where} returned messages that are not a list of {{role: str, content: str}}")
    return list(messages)
