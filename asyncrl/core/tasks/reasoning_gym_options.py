"""The check of a reasoning-gym dataset's name and options, apart from the task itself: the config runs it at
load, in every process, and the controller's image has neither the model stack the task module imports nor
reasoning-gym (the roles that build the task check the options there)."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

RESERVED_OPTIONS = ("seed", "size")
"""Dataset options the task sets itself (from task.reasoning_gym.seed and size)."""


def spec_problem(name: str, options: dict[str, Any]) -> tuple[str, str] | None:
    """(key under the dataset's entry, message) when reasoning-gym has no dataset `name` or refuses `options`;
    None when it accepts them. The key is "name" or "config.<option>" ("config" for a value it refuses)."""
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError:  # the controller's image: the roles that build the task check it
        return None

    if name == "composite" or name not in DATASETS:
        close = difflib.get_close_matches(name, [n for n in DATASETS if n != "composite"], n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else " (reasoning_gym.factory.DATASETS lists them)"
        return "name", f"{name!r} is not a reasoning-gym dataset{hint}"
    config_cls = DATASETS[name][1]
    known = [f.name for f in dataclasses.fields(config_cls) if f.name not in RESERVED_OPTIONS]
    for option in options:
        if option in RESERVED_OPTIONS:
            return f"config.{option}", f"set by the task (task.reasoning_gym.{option}), not per dataset"
        if option not in known:
            return f"config.{option}", f"not an option of {name}; its options: {', '.join(known)}"
    try:
        config = config_cls(**options)
        if hasattr(config, "validate"):
            config.validate()
    except (AssertionError, TypeError, ValueError) as err:
        return "config", f"{name} refuses these options: {err or type(err).__name__}"
    return None
