"""Tool calls in a model turn's text, in the format of the model's chat template (`environment.tool_call_format`).
Pure.

- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call (Qwen2.5, Qwen3,
  Hermes and the templates that follow them).
- `mistral`: `[TOOL_CALLS]` then a JSON array of `{"name": ..., "arguments": {...}}` (Mistral's v3 templates).
- `llama3_json`: the turn is a JSON object `{"name": ..., "parameters": {...}}`, optionally after
  `<|python_tag|>`, several separated by `;` (Llama 3.1, 3.2 and 3.3's JSON tool calling).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
OPEN = "<tool_call>"
MISTRAL = "[TOOL_CALLS]"
PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict
    error: str = ""
    """Why the block is not a valid call ("" for a valid one): it goes back to the model as the call's result."""


def parse_tool_calls(text: str, call_format: str = "hermes") -> list[ToolCall]:
    """The calls in `text`, in order ([]: the turn is a final answer). What announces a call but is not a valid
    one (a tag not closed, JSON that does not parse, no string name, arguments that are not an object) is a call
    with an error, which the model reads back."""
    return FORMATS[call_format](text)


def _hermes(text: str) -> list[ToolCall]:
    calls = [_call(block, "arguments") for block in _BLOCK.findall(text)]
    if text.count(OPEN) > len(calls):
        calls.append(_error("a <tool_call> block is not closed with </tool_call>"))
    return calls


def _mistral(text: str) -> list[ToolCall]:
    at = text.find(MISTRAL)
    if at < 0:
        return []
    body = text[at + len(MISTRAL):].strip()
    try:
        items = json.loads(body)
    except ValueError as err:
        return [_error(f"the tool calls after {MISTRAL} are not JSON: {err}")]
    if not isinstance(items, list) or not items:
        return [_error(f"{MISTRAL} must be followed by a non-empty JSON array of calls")]
    return [_checked(item, "arguments") for item in items]


def _llama3_json(text: str) -> list[ToolCall]:
    body = text.strip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG):].strip()
    elif not body.startswith("{"):
        return []  # prose: the final answer
    decoder, calls, at = json.JSONDecoder(), [], 0
    while at < len(body):
        try:
            item, at = decoder.raw_decode(body, at)
        except ValueError as err:
            return [*calls, _error(f"the tool call is not JSON: {err}")]
        calls.append(_checked(item, "parameters"))
        at = _skip_separator(body, at)
    return calls


def _skip_separator(body: str, at: int) -> int:
    while at < len(body) and body[at] in " \t\n;":
        at += 1
    return at


def _call(block: str, arguments_key: str) -> ToolCall:
    try:
        item = json.loads(block)
    except ValueError as err:
        return _error(f"the tool call is not JSON: {err}")
    return _checked(item, arguments_key)


def _checked(item, arguments_key: str) -> ToolCall:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return _error('the tool call must be a JSON object with a string "name"')
    arguments = item.get(arguments_key, {})
    if isinstance(arguments, str):  # some templates carry the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    if not isinstance(arguments, dict):
        return ToolCall(name=item["name"], arguments={}, error=f'"{arguments_key}" must be a JSON object')
    return ToolCall(name=item["name"], arguments=arguments)


def _error(why: str) -> ToolCall:
    return ToolCall(name="", arguments={}, error=why)


FORMATS: dict[str, Callable[[str], list[ToolCall]]] = {"hermes": _hermes, "mistral": _mistral,
                                                       "llama3_json": _llama3_json}
"""The formats `environment.tool_call_format` may name."""
