"""The built-in tool environment (`environment.type: tools`): the model calls user functions in its chat
template's tool-call format; each result (or the error) comes back as a tool message, and a turn without a tool
call is the final answer, scored by the run's reward."""

from __future__ import annotations

import json
import logging
import math

from asyncrl.core.agents.environment import Environment, Session, StepResult, ToolOutcome
from asyncrl.core.agents.tool_calls import parse_tool_calls
from asyncrl.core.agents.tools import Tool
from asyncrl.core.runtime.log_once import FirstOfKind
from asyncrl.core.tasks.base import Prompt

log = logging.getLogger(__name__)
_FAILURES = FirstOfKind()
MAX_RESULT_CHARS = 4096
"""A tool's result longer than this is cut (with a note) before the model reads it."""


class ToolEnvironment(Environment):
    def __init__(self, tools: dict[str, Tool], reward_fn, call_format: str = "hermes"):
        """`reward_fn(final_answer_text, metadata) -> float`: the run's reward; `call_format`: how the model writes
        its calls (`environment.tool_call_format`)."""
        self._tools = tools
        self.tools = [tool.schema for tool in tools.values()]
        self._reward_fn = reward_fn
        self._call_format = call_format

    def start(self, prompt: Prompt) -> Session:
        return ToolSession(self._tools, self._reward_fn, prompt.metadata, self._call_format)


class ToolSession(Session):
    def __init__(self, tools: dict[str, Tool], reward_fn, metadata: dict, call_format: str = "hermes"):
        self._tools, self._reward_fn, self._metadata = tools, reward_fn, metadata
        self._call_format = call_format

    def step(self, action: str) -> StepResult:
        calls = parse_tool_calls(action, self._call_format)
        if not calls:
            reward = float(self._reward_fn(action, self._metadata))
            if not math.isfinite(reward):
                raise ValueError(f"the reward function returned {reward}")
            return StepResult(messages=[], reward=reward, done=True)
        messages, outcomes = [], []
        for call in calls:
            content, ok = self._run(call)
            messages.append({"role": "tool", "content": content})
            outcomes.append(ToolOutcome(tool=call.name if call.name in self._tools else "<invalid>", ok=ok))
        return StepResult(messages=messages, tools=tuple(outcomes))

    def _run(self, call) -> tuple[str, bool]:
        """(what the model reads back, whether the call succeeded)."""
        if call.error:
            return f"error: {call.error}", False
        tool = self._tools.get(call.name)
        if tool is None:
            return f"error: no tool named {call.name!r} (tools: {', '.join(sorted(self._tools))})", False
        try:
            result = tool.call(call.arguments)
        except Exception as err:  # noqa: BLE001 - the tool's failure is the model's observation
            # Once per tool and error type: a tool failing for everyone (its server gone) shows without
            # flooding the log; the model reads every failure and the metrics count them.
            if _FAILURES.first((call.name, type(err).__name__)):
                log.warning("tool %r failed (the model reads the error; logged once per tool and error type): %s: %s",
                            call.name, type(err).__name__, err)
            return f"error: {type(err).__name__}: {err}", False
        text = result if isinstance(result, str) else json.dumps(result, default=str)
        if len(text) > MAX_RESULT_CHARS:
            text = text[:MAX_RESULT_CHARS] + f"... ({len(text) - MAX_RESULT_CHARS} more characters cut)"
        return text, True

