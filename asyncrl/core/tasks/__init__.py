"""Tasks: deterministic prompt streams, held-out sets and exact rewards, looked up by name."""

from asyncrl.core.tasks.base import Prompt, Task
from asyncrl.core.tasks.factory import get_reward, get_task, task_for_run
from asyncrl.core.tasks.registry import register_reward, register_task

__all__ = ["Prompt", "Task", "get_reward", "get_task", "register_reward", "register_task", "task_for_run"]
