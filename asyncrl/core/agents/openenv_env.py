"""`environment.type: openenv`: episodes against an OpenEnv environment server, through the `openenv`
package's own client (`GenericEnvClient`: one WebSocket session per episode, `reset` then `step` until the
server says done). The server is the user's: any OpenEnv environment (`openenv.core.env_server.create_app`),
local or remote, started before the run (docs/agents.md).

The model's turn (its text, without the end-of-turn token) goes into one field of the action
(`environment.openenv.action_field`); one field of each observation (or all of them, as JSON) comes back to the
model as a chat message; the server's rewards are the turns' rewards. The reset observation follows the
task's prompt as the episode's first message. Every session's calls run on one event loop thread of the
environment, so a thousand episodes in flight hold a thousand sockets, not a thousand threads; the calls
block only the runner's worker that makes them, with `environment.step_timeout_s` as their time limit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import os
import threading

from asyncrl.core.agents.environment import Environment, EnvironmentFault, Session, StepResult
from asyncrl.core.tasks.base import Prompt

MAX_OBSERVATION_CHARS = 8192
"""An observation longer than this is cut (with a note) before the model reads it."""
CLOSE_S = 5.0
"""How long closing a session may take."""


def client_class():
    """OpenEnv's generic client; a config error naming the missing package when it is not installed."""
    try:
        from openenv.core.generic_client import GenericEnvClient
    except ImportError as err:
        raise ValueError("environment.type: openenv needs the openenv package "
                         f"(pip install 'asyncrl[openenv]'): {err}") from None
    return GenericEnvClient


class OpenEnvEnvironment(Environment):
    def __init__(self, cfg, step_timeout_s: float):
        """`cfg`: the `environment.openenv` section; `step_timeout_s`: each call's time limit."""
        self._client_class = client_class()
        self.cfg = cfg
        self.timeout_s = step_timeout_s
        token = os.environ.get(cfg.token_env, "") if cfg.token_env else ""
        self._extra = {"headers": {"Authorization": f"Bearer {token}"}} if token else {}
        if token and "headers" not in inspect.signature(self._client_class).parameters:
            raise ValueError(f"environment.openenv.token_env: this openenv client ({self._client_class.__module__}) "
                             "sends no headers; a bearer token needs openenv >= 0.10")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="openenv", daemon=True)
        self._thread.start()

    def run(self, coroutine, timeout_s: float):
        """Run `coroutine` on the environment's loop; its result, or its error. Past `timeout_s` it is cancelled
        (a connection still opening is closed, not left to the server) and the time-out raised."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def start(self, prompt: Prompt) -> Session:
        kwargs = {}
        for key in self.cfg.reset_fields:
            if key not in prompt.metadata:
                raise EnvironmentFault(f"environment.openenv.reset_fields: the prompt has no {key!r} "
                                       f"(its fields: {', '.join(sorted(prompt.metadata))})")
            kwargs[key] = prompt.metadata[key]
        client, first = self.run(self._open(kwargs), self.timeout_s + CLOSE_S)
        session = OpenEnvSession(self, client)
        if first.done:
            session.close()
            raise EnvironmentFault("reset answered an episode that is already done")
        opening = self.messages(first.observation)
        session.opening = opening if opening[0]["content"] else []  # an empty reset observation adds nothing
        return session

    async def _open(self, kwargs: dict):
        client = self._client_class(base_url=self.cfg.url, connect_timeout_s=self.timeout_s,
                                    message_timeout_s=self.timeout_s, **self._extra)
        try:
            await client.connect()
            return client, await client.reset(**kwargs)
        except BaseException:
            await _close_quietly(client)
            raise

    def messages(self, observation) -> list[dict]:
        """The observation as the model reads it, one message: the configured field (text as it is, anything
        else as JSON), or the whole observation as JSON."""
        if not isinstance(observation, dict):
            raise EnvironmentFault(f"the observation is {type(observation).__name__}, not an object")
        field = self.cfg.observation_field
        if field is None:
            value = {k: v for k, v in observation.items() if k != "metadata"}
        elif field in observation:
            value = observation[field]
        else:
            raise EnvironmentFault(f"environment.openenv.observation_field: the observation has no {field!r} "
                                   f"(its fields: {', '.join(sorted(observation))})")
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        if len(text) > MAX_OBSERVATION_CHARS:
            text = text[:MAX_OBSERVATION_CHARS] + f"... ({len(text) - MAX_OBSERVATION_CHARS} more characters cut)"
        return [{"role": self.cfg.observation_role, "content": text}]

    def close(self) -> None:
        """Close every session still open (their sockets' tasks cancelled), then stop the loop."""
        if not self._loop.is_running():
            return
        try:
            self.run(_cancel_all(), CLOSE_S)
        except Exception:  # noqa: BLE001, S110 - closing what is left is best effort
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CLOSE_S)


class OpenEnvSession(Session):
    def __init__(self, environment: OpenEnvEnvironment, client):
        self._environment, self._client = environment, client

    def step(self, action: str) -> StepResult:
        env = self._environment
        result = env.run(_step(self._client, {env.cfg.action_field: action}), env.timeout_s + CLOSE_S)
        reward = 0.0 if result.reward is None else result.reward  # OpenEnv allows none, a bool or a number
        if not isinstance(reward, (int, float)):
            raise EnvironmentFault(f"the server's reward is {reward!r}, not a number")
        done = bool(result.done)
        return StepResult(messages=[] if done else env.messages(result.observation), reward=float(reward), done=done)

    def close(self) -> None:
        try:
            self._environment.run(_close_quietly(self._client), CLOSE_S)
        except Exception:  # noqa: BLE001, S110 - the server may be gone; nothing is left to release then
            pass


async def _step(client, action: dict):
    """The client's calls are made on the environment's loop (a call from another thread would start a loop of
    its own)."""
    return await client.step(action)


async def _cancel_all() -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _close_quietly(client) -> None:
    try:
        await asyncio.wait_for(client.close(), CLOSE_S)
    except BaseException:  # noqa: BLE001, S110 - best effort: the socket may be dead already
        pass
