"""Task and reward lookups by name: the built-in tasks register themselves when this module loads."""

from __future__ import annotations

import asyncrl.core.tasks.arith  # noqa: F401  (registers the built-in "arith" task and its reward)
from asyncrl.core.tasks.base import RewardFn, Task
from asyncrl.core.tasks.registry import REWARDS, TASKS
from asyncrl.core.tokenizer import TextCodec


def get_task(task_cfg, codec: TextCodec | None = None) -> Task:
    """The task named by `task_cfg.name` (a `TaskConfig`) with its reward bound; `codec` defaults to the
    task's built-in one."""
    if task_cfg.name not in TASKS:
        raise ValueError(f"unknown task {task_cfg.name!r}; registered: {sorted(TASKS)}")
    task = TASKS[task_cfg.name](task_cfg, codec)
    task.reward_fn = get_reward(task.reward_name)
    return task


def get_reward(name: str) -> RewardFn:
    """The reward function registered under `name` (e.g. "arith_exact")."""
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; registered: {sorted(REWARDS)}")
    return REWARDS[name]
