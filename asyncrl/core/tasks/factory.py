"""Task and reward lookups by name: the built-in tasks register themselves when this module loads."""

from __future__ import annotations

import asyncrl.core.tasks.arith
import asyncrl.core.tasks.dataset
import asyncrl.core.tasks.reasoning_gym
import asyncrl.core.tasks.tool_sum  # noqa: F401  (registers the "dataset", "reasoning_gym" and "tool_sum" tasks)
from asyncrl.core.model.tokenizer import ModelTokenizer
from asyncrl.core.tasks.base import RewardFn, Task
from asyncrl.core.tasks.registry import REWARDS, TASKS
from asyncrl.core.tasks.rewards import build_reward


def get_task(task_cfg, tokenizer: ModelTokenizer | None = None, reward_cfg=None) -> Task:
    """The task named by `task_cfg.name` (a `TaskConfig`) with its reward bound: the one `reward_cfg` (a
    `RewardConfig`) names, or the task's own. `tokenizer`: the policy's (`ModelTokenizer.load(model.path)`);
    a synthetic task falls back to its built-in one without it."""
    if task_cfg.name not in TASKS:
        raise ValueError(f"unknown task {task_cfg.name!r}; registered: {sorted(TASKS)}")
    task = TASKS[task_cfg.name](task_cfg, tokenizer)
    own = task.own_reward() or REWARDS.get(task.reward_name)
    task.reward_fn = own if reward_cfg is None else build_reward(reward_cfg, own)
    if task.reward_fn is None:
        raise ValueError(f"task {task.name!r} has no reward of its own: set the reward section (reward.type)")
    return task


def task_for_run(config) -> Task:
    """The run's task as every process builds it: the policy checkpoint's tokenizer, the configured reward."""
    return get_task(config.task, ModelTokenizer.load(config.model.path), config.reward)


def get_reward(name: str) -> RewardFn:
    """The reward function registered under `name` (e.g. "arith_exact")."""
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; registered: {sorted(REWARDS)}")
    return REWARDS[name]
