"""User functions a model calls as tools: loaded by name (`file.py:fn`, as rewards are), described by the JSON
schema the chat template renders (transformers' `get_json_schema`: type hints and the docstring's Args)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from asyncrl.core.tasks.rewards import load_function


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable
    schema: dict
    """{"type": "function", "function": {"name", "description", "parameters"}}: what the chat template renders."""

    def call(self, arguments: dict):
        """fn(**arguments); TypeError naming the tool when they do not fit its signature."""
        try:
            inspect.signature(self.fn).bind(**arguments)
        except TypeError as err:
            raise TypeError(f"{self.name}: {err}") from None
        return self.fn(**arguments)


def load_tools(specs: list[str]) -> dict[str, Tool]:
    """name -> Tool for each `package.module:function` or `path/to/file.py:function`; ValueError naming the
    spec that does not load, has no schema (no docstring, an untyped argument) or repeats a name."""
    from transformers.utils import get_json_schema

    tools: dict[str, Tool] = {}
    for spec in specs:
        fn = load_function(spec, kind="tool")
        try:
            schema = get_json_schema(fn)
        except Exception as err:  # noqa: BLE001 - transformers' schema errors, reported with the spec
            raise ValueError(f"{spec!r}: no JSON schema for the chat template: {err}") from None
        schema["function"].pop("return", None)
        name = schema["function"]["name"]
        if name in tools:
            raise ValueError(f"{spec!r}: a second tool named {name!r}")
        tools[name] = Tool(name=name, fn=fn, schema=schema)
    return tools
