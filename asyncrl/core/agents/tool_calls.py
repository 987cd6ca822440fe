"""Tool calls in a model turn's text, in the `hermes` format: `<tool_call>{"name": ..., "arguments": {...}}
</tool_call>`, one block per call (Qwen2.5, Qwen3 and Hermes chat templates). Pure."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
OPEN = "<tool_call>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict
    error: str = ""
    """Why the block is not a valid call ("" for a valid one): it goes back to the model as the call's result."""


def parse_tool_calls(text: str) -> list[ToolCall]:
    """The calls in `text`, in order ([]: the turn is a final answer). An opening tag without its closing one,
    a block that is not a JSON object with a string `name` and an object `arguments`, are calls with an error."""
    calls = []
    for block in _BLOCK.findall(text):
        calls.append(_parse_block(block))
    if text.count(OPEN) > len(calls):
        calls.append(ToolCall(name="", arguments={}, error="a <tool_call> block is not closed with </tool_call>"))
    return calls


def _parse_block(block: str) -> ToolCall:
    try:
        call = json.loads(block)
    except ValueError as err:
        return ToolCall(name="", arguments={}, error=f"the tool call is not JSON: {err}")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ToolCall(name="", arguments={}, error='the tool call must be a JSON object with a string "name"')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some templates carry the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    if not isinstance(arguments, dict):
        return ToolCall(name=call["name"], arguments={}, error='"arguments" must be a JSON object')
    return ToolCall(name=call["name"], arguments=arguments)
