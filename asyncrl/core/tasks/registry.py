"""Name -> task class and name -> reward function registries (config fields hold the names).

Only the tables and their writers: the lookups, which load the built-in tasks first, are in
`asyncrl.core.tasks.factory`, so a task module can register itself without an import cycle.
"""

from __future__ import annotations

from collections.abc import Callable

from asyncrl.core.tasks.base import RewardFn, Task

TASKS: dict[str, Callable[..., Task]] = {}
REWARDS: dict[str, RewardFn] = {}


def register_task(name: str, factory: Callable[..., Task]) -> None:
    """Register `factory(task_cfg, tokenizer) -> Task` under `name`."""
    TASKS[name] = factory


def register_reward(name: str, fn: RewardFn) -> None:
    """Register `fn(response_text, metadata) -> float` under `name`."""
    REWARDS[name] = fn
