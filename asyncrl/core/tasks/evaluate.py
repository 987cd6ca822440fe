"""Greedy accuracy on a task's held-out set (the learner's progress measure).

Works with anything that generates from token ids: an `Engine` (its `.generate`) or a plain callable with the
same signature `(prompts, params, n) -> list[list[Generation]]`, e.g. `functools.partial(generate_with_model,
model, eos_ids=..., pad_id=...)` over the learner's own in-process model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asyncrl.core.model.sampling import SamplingParams
from asyncrl.core.tasks.base import Prompt, Task

Scorer = Callable[[list[tuple[str, dict[str, Any]]]], list[float]]
"""Rewards of (response text, metadata) pairs, in order."""


def _generate_fn(generator) -> Callable:
    if hasattr(generator, "generate"):
        return generator.generate
    if callable(generator):
        return generator
    raise ValueError(f"expected an Engine or a generate callable, got {type(generator).__name__}")


def greedy_rewards(
    generator, task: Task, prompts: list[Prompt] | None = None, max_new_tokens: int | None = None, episodes=None,
    score: Scorer | None = None,
) -> list[float]:
    """Reward of the greedy response to each prompt (default: the task's held-out set); with `episodes` (an
    `asyncrl.core.agents.factory.Episodes`), of the greedy episode, each turn at most `max_new_tokens`.
    `score`: how the responses are scored (a `RewardPool`'s `score`: each reward bounded in time); None: the
    task's reward, called here."""
    prompts = task.eval_prompts() if prompts is None else prompts
    params = SamplingParams(max_new_tokens=max_new_tokens or task.max_response_tokens, greedy=True)
    if episodes is not None:
        runner = episodes.runner_over(_generate_fn(generator), params, in_flight=len(prompts))
        try:
            return [result.reward for result in runner.run(prompts)]
        finally:
            runner.close()
    groups = _generate_fn(generator)([p.token_ids for p in prompts], params, 1)
    if len(groups) != len(prompts):
        raise ValueError(f"generator returned {len(groups)} groups for {len(prompts)} prompts")
    return (score or own_rewards(task))(
        [(task.decode_response(group[0].token_ids), p.metadata) for p, group in zip(prompts, groups)])


def own_rewards(task: Task) -> Scorer:
    """A scorer that calls the task's reward on each (response text, metadata) pair in turn."""
    return lambda items: [task.reward(text, metadata) for text, metadata in items]


def greedy_accuracy(
    generator, task: Task, prompts: list[Prompt] | None = None, max_new_tokens: int | None = None, episodes=None,
    score: Scorer | None = None,
) -> float:
    """Mean greedy reward over the held-out set (for exact-match rewards: the fraction solved)."""
    rewards = greedy_rewards(generator, task, prompts, max_new_tokens, episodes, score)
    return sum(rewards) / len(rewards) if rewards else 0.0
