"""Tasks: deterministic prompt streams, held-out sets and exact rewards, looked up by name.

The names below load on first use: the config imports the reward and option checks of this room at load in
every process, the controller's too, whose image has no tokenizer or model stack for `base` to import."""

import importlib

_EXPORTS = {"Prompt": "base", "Task": "base", "get_reward": "factory", "get_task": "factory",
            "task_for_run": "factory", "register_reward": "registry", "register_task": "registry"}
__all__ = ["Prompt", "Task", "get_reward", "get_task", "register_reward", "register_task", "task_for_run"]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
