"""The `environment` section of the configuration schema: multi-turn episodes (docs/agents.md). Part of the one
schema in `asyncrl.core.config.schema`, kept apart as `rollout_config.py` is."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from asyncrl.core.config.base import Section


class OpenEnvConfig(Section):
    """An OpenEnv environment server the episodes play against (`environment.type: openenv`, docs/agents.md)."""

    url: str = ""
    """Base URL of the running OpenEnv server (`http://host:port`, `https://...`, or `ws://`/`wss://`); every
    rollout replica and evaluation connects to it, one WebSocket session per episode, so its
    `max_concurrent_envs` must hold every episode in flight. asyncrl does not start it."""
    action_field: str = Field("message", min_length=1)
    """The field of the environment's action that carries the model's turn (its text, without the end-of-turn
    token): `{action_field: text}` is sent as the action."""
    observation_field: str | None = None
    """The field of each observation the model reads (text as it is, anything else as JSON); null: the whole
    observation as JSON (its metadata left out). An observation without the field ends the episode
    (`environment_error`)."""
    observation_role: Literal["user", "tool"] = "user"
    """The chat role the observations take in the model's chat template."""
    reset_fields: list[str] = Field(default_factory=list)
    """Fields of the prompt's metadata (the dataset row's, e.g. `answer`) passed to the server's `reset` as
    keyword arguments, so the environment knows the task; []: `reset()` alone. The reset observation, when it
    is not empty, follows the prompt as the episode's first message."""
    token_env: str = ""
    """Name of an environment variable holding a bearer token for the server (sent as `Authorization: Bearer`;
    a private Hugging Face Space); the token itself never enters the configuration. Empty: none."""

    @model_validator(mode="after")
    def _check_url(self) -> OpenEnvConfig:
        if self.url and urlsplit(self.url).scheme not in ("http", "https", "ws", "wss"):
            raise ValueError(f"environment.openenv.url: must start with http://, https://, ws:// or wss://, "
                             f"got {self.url!r}")
        return self


class EnvironmentConfig(Section):
    """Where a sample is an episode: the model acts, the environment answers, turn after turn."""

    type: Literal["none", "tools", "openenv"] = "none"
    """`none`: one prompt, one response (single-turn). `tools`: the model calls the functions in `tools` in its
    chat template's tool-call format; each call's result comes back as a tool message, and a turn without a
    tool call is the final answer, scored by the run's reward. `openenv`: each turn is an action sent to the
    OpenEnv server of `openenv` (the `openenv` package, `pip install 'asyncrl[openenv]'`), whose observations
    come back as messages and whose rewards score the episode."""
    tools: list[str] = Field(default_factory=list)
    """tools: the functions the model may call, each `package.module:function` or `path/to/file.py:function`
    (relative to the working directory), imported and checked at load. Each one's JSON schema (from its type
    hints and its docstring's Args section, as transformers' `get_json_schema` builds it) is handed to the chat
    template, and the model calls it by its name."""
    tool_call_format: Literal["hermes", "mistral", "llama3_json"] = "hermes"
    """How a model turn writes its tool calls, as its chat template teaches it: `hermes`:
    `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen2.5, Qwen3, Hermes and the templates that
    follow them); `mistral`: `[TOOL_CALLS][{"name": ..., "arguments": {...}}]` (Mistral); `llama3_json`: the turn
    is `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`, several separated by `;`
    (Llama 3.1 to 3.3)."""
    max_turns: int = Field(8, ge=1)
    """Model turns at most per episode; an episode still calling tools then ends (`max_turns`, reward 0)."""
    max_episode_tokens: int = Field(256, ge=1)
    """Response tokens at most per episode, the model's and the observations' together (each turn samples at
    most sampling.max_new_tokens); an episode that reaches it ends (`max_tokens`, reward 0)."""
    step_timeout_s: float = Field(10.0, gt=0)
    """Time per environment call (all the tool calls of one turn), from the moment it is made: one that takes
    longer ends its episode (`timeout`, reward 0). A call that never returns keeps its worker thread; once every
    worker is kept so, the replica exits to be restarted."""
    episode_timeout_s: float = Field(300.0, gt=0)
    """Wall time per episode from its start; past it the episode ends (`timeout`, reward 0). Below
    rollout.lease_deadline_s (refused otherwise): a replica whose lease outlives that deadline exits as stuck."""
    workers: int = Field(0, ge=0)
    """Threads per process that run environment calls beside generation, so episodes waiting on a slow tool do
    not hold up the others. 0: one per episode in flight, so a call never waits for a thread (the right choice
    for calls that wait on a server or sleep); set a number to bound the calls that run at once (CPU-heavy
    tools): a call waiting for a thread counts against its step_timeout_s."""
    openenv: OpenEnvConfig = OpenEnvConfig()
    """The OpenEnv server (`type: openenv`)."""
    episodes_in_flight: int = Field(0, ge=0)
    """Episodes a rollout replica keeps going at once (0: rollout.leases_per_batch x sampling.group_size). The
    model's turns of every episode ready are generated together; the others wait on the environment."""

    @model_validator(mode="after")
    def _check(self) -> EnvironmentConfig:
        if self.type == "tools":
            if not self.tools:
                raise ValueError("environment.tools: name at least one function when environment.type is 'tools'")
            from asyncrl.core.agents.tools import load_tools

            try:
                load_tools(self.tools)
            except ValueError as err:
                raise ValueError(f"environment.tools: {err}") from None
        if self.type == "openenv":
            if not self.openenv.url:
                raise ValueError("environment.openenv.url: name the OpenEnv server when environment.type is 'openenv'")
            from asyncrl.core.agents.openenv_env import client_class

            client_class()  # the package is installed, or the error says how to install it
        return self
