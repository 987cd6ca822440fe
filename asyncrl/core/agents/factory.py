"""The environment a config names (`environment.type`), and `Episodes`: what every process that runs episodes
(a rollout replica, an evaluation, the warm start) builds its runners from."""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.core.agents.environment import Environment
from asyncrl.core.agents.render import TurnRenderer
from asyncrl.core.agents.runner import EpisodeLimits, EpisodeRunner, GenerateTurns, RunnerHooks
from asyncrl.core.model.sampling import SamplingParams


def make_environment(cfg, reward_fn) -> Environment | None:
    """The `environment` section's environment (None for `type: none`); `reward_fn(text, metadata)` scores a
    final answer (`tools`; an OpenEnv server scores its own episodes)."""
    if cfg.type == "none":
        return None
    if cfg.type == "tools":
        from asyncrl.core.agents.tool_env import ToolEnvironment
        from asyncrl.core.agents.tools import load_tools

        return ToolEnvironment(load_tools(cfg.tools), reward_fn, cfg.tool_call_format)
    if cfg.type == "openenv":
        from asyncrl.core.agents.openenv_env import OpenEnvEnvironment

        return OpenEnvEnvironment(cfg.openenv, cfg.step_timeout_s)
    raise ValueError(f"environment.type: unknown {cfg.type!r}")


@dataclass(frozen=True)
class Episodes:
    """A run's episodes: its environment, the policy's tokenizer (which renders observations and decodes
    actions), the limits."""

    config: object
    """The `environment` section."""
    environment: Environment
    tokenizer: object
    """The policy's `ModelTokenizer`."""
    max_context: int
    """The model's context (max_position_embeddings)."""

    @classmethod
    def for_task(cls, cfg, task, max_context: int) -> Episodes | None:
        """The episodes of the `environment` section `cfg` over `task` (its tokenizer, its reward); None for
        `type: none`."""
        environment = make_environment(cfg, task.reward)
        return None if environment is None else cls(cfg, environment, task.tokenizer, max_context)

    @classmethod
    def for_run(cls, config, task, model_context: int) -> Episodes | None:
        """The run's episodes (None for `environment.type: none`): their context is the model's
        (`model_context`, `TrajectoryLimits.max_sequence_tokens`), or a vLLM engine's `max_model_len` when that
        is shorter (the rollout replicas' engines play them)."""
        context = model_context
        if config.rollout.engine.type == "vllm":
            context = min(context, config.rollout.engine.max_model_len)
        return cls.for_task(config.environment, task, context)

    def renderer(self) -> TurnRenderer:
        return TurnRenderer(self.tokenizer, self.environment.tools)

    def runner(self, generate: GenerateTurns, params: SamplingParams, in_flight: int,
               hooks: RunnerHooks | None = None) -> EpisodeRunner:
        """A runner for up to `in_flight` episodes at once: one environment thread each unless
        `environment.workers` bounds them."""
        return EpisodeRunner(environment=self.environment, renderer=self.renderer(),
                             decode=self.tokenizer.decode_response, generate=generate, params=params,
                             limits=EpisodeLimits.from_config(self.config, self.max_context),
                             workers=self.config.workers or max(1, in_flight), hooks=hooks)

    def runner_over(self, generate_groups, params: SamplingParams, in_flight: int) -> EpisodeRunner:
        """`runner` over an engine-style `generate(prompts, params, n) -> list[list[Generation]]` (`turns_of`)."""
        return self.runner(turns_of(generate_groups), params, in_flight)


def turns_of(generate_groups) -> GenerateTurns:
    """A GenerateTurns over an engine-style `generate(prompts, params, n) -> list[list[Generation]]`."""
    def generate(contexts, params, seeds=None):
        if not contexts:
            return []
        groups = generate_groups(contexts, params, 1) if seeds is None else generate_groups(contexts, params, 1, seeds)
        return [group[0] for group in groups]

    return generate
