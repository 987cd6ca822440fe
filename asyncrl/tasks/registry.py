"""Name -> task class and name -> reward function registries (config fields hold the names)."""

from __future__ import annotations

from collections.abc import Callable

from asyncrl.tasks.base import Task
from asyncrl.tokenizer import TextCodec

RewardFn = Callable[[str, dict[str, str]], float]

_TASKS: dict[str, Callable[..., Task]] = {}
_REWARDS: dict[str, RewardFn] = {}


def register_task(name: str, factory: Callable[..., Task]) -> None:
    """Register `factory(task_cfg, codec) -> Task` under `name`."""
    _TASKS[name] = factory


def register_reward(name: str, fn: RewardFn) -> None:
    """Register `fn(response_text, metadata) -> float` under `name`."""
    _REWARDS[name] = fn


def _ensure_builtins() -> None:
    # Importing the built-in task modules registers them; done lazily to keep import order free.
    import asyncrl.tasks.arith  # noqa: F401


def get_task(task_cfg, codec: TextCodec | None = None) -> Task:
    """The task named by `task_cfg.name` (a `TaskConfig`); `codec` defaults to the task's built-in one."""
    _ensure_builtins()
    if task_cfg.name not in _TASKS:
        raise ValueError(f"unknown task {task_cfg.name!r}; registered: {sorted(_TASKS)}")
    return _TASKS[task_cfg.name](task_cfg, codec)


def get_reward(name: str) -> RewardFn:
    """The reward function registered under `name` (e.g. "arith_exact")."""
    _ensure_builtins()
    if name not in _REWARDS:
        raise ValueError(f"unknown reward {name!r}; registered: {sorted(_REWARDS)}")
    return _REWARDS[name]
