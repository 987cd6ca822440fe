"""The agent demo's tool served as an OpenEnv environment: what a team that already keeps its environments in
OpenEnv runs, and asyncrl trains against over OpenEnv's own protocol (`environment.type: openenv`).

The episode's task comes with `reset(answer=...)` (the dataset row's answer, `environment.openenv.reset_fields`).
Each action's `message` is the model's turn: `<tool_call>{"name": "add", "arguments": {"a": .., "b": ..}}</tool_call>`
is answered with the sum; a turn without a tool call is the final answer, and ends the episode with reward 1
when it is the right one (else 0).

    .venv/bin/python examples/agent/openenv_calculator.py --port 8011
    .venv/bin/asyncrl up --config examples/tool-agent.yaml --set environment.type=openenv \
        --set environment.openenv.url=http://127.0.0.1:8011 ...      (docs/agents.md has the whole line)
"""

from __future__ import annotations

import argparse
import json
import re

import uvicorn
from openenv.core.env_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class TurnAction(Action):
    message: str
    """The model's turn, as it wrote it."""


class ToolObservation(Observation):
    text: str = ""
    """The tool's result (or what went wrong), for the model to read."""


class Calculator(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._answer = ""
        self._state = State(step_count=0)

    def reset(self, seed=None, episode_id=None, answer: str = "", **kwargs) -> ToolObservation:
        self._answer = str(answer)
        self._state = State(episode_id=episode_id, step_count=0)
        return ToolObservation()  # the prompt says it all: nothing to add

    def step(self, action: TurnAction, timeout_s=None, **kwargs) -> ToolObservation:
        self._state.step_count += 1
        calls = CALL.findall(action.message)
        if not calls:
            return ToolObservation(reward=float(action.message.strip() == self._answer), done=True)
        return ToolObservation(text="".join(self._run(call) for call in calls))

    @staticmethod
    def _run(call: str) -> str:
        try:
            request = json.loads(call)
            arguments = request["arguments"]
            if request["name"] != "add":
                return f"error: no tool named {request['name']!r}"
            return str(int(arguments["a"]) + int(arguments["b"]))
        except (ValueError, KeyError, TypeError) as err:
            return f"error: {type(err).__name__}: {err}"

    @property
    def state(self) -> State:
        return self._state


def build_app(max_sessions: int = 512):
    """The FastAPI app: one Calculator per WebSocket session, up to `max_sessions` at once (every episode
    asyncrl keeps in flight holds one)."""
    return create_app(Calculator, TurnAction, ToolObservation, env_name="calculator", max_concurrent_envs=max_sessions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--max-sessions", type=int, default=512)
    args = parser.parse_args()
    uvicorn.run(build_app(args.max_sessions), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
