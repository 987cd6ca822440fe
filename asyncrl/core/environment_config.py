"""The `environment` section of the configuration schema: multi-turn episodes (docs/agents.md). Part of the one
schema in `asyncrl.core.config`, kept apart as `rollout_config.py` is."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from asyncrl.core.config_base import Section


class EnvironmentConfig(Section):
    """Where a sample is an episode: the model acts, the environment answers, turn after turn."""

    type: Literal["none", "tools"] = "none"
    """`none`: one prompt, one response (single-turn). `tools`: the model calls the functions in `tools` in its
    chat template's tool-call format; each call's result comes back as a tool message, and a turn without a
    tool call is the final answer, scored by the run's reward."""
    tools: list[str] = Field(default_factory=list)
    """tools: the functions the model may call, each `package.module:function` or `path/to/file.py:function`
    (relative to the working directory), imported and checked at load. Each one's JSON schema (from its type
    hints and its docstring's Args section, as transformers' `get_json_schema` builds it) is handed to the chat
    template, and the model calls it by its name."""
    tool_call_format: Literal["hermes"] = "hermes"
    """How a model turn writes its tool calls: `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
    (Qwen2.5, Qwen3, Hermes and the chat templates that follow them)."""
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
        return self
