"""Tasks: deterministic prompt streams, held-out sets and exact rewards, looked up by name."""

from asyncrl.tasks.base import Prompt, Task
from asyncrl.tasks.registry import get_reward, get_task, register_reward, register_task

__all__ = ["Prompt", "Task", "get_reward", "get_task", "register_reward", "register_task"]
