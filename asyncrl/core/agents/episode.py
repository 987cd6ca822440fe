"""One episode as it grows (the model's turns, the environment's observations) and the record it ends as
(pure): the response is every token after the prompt, in order, with the observations' spans masked out of
training and each turn's end and reward kept."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from asyncrl.core.engines.base import Generation

DONE, MAX_TURNS, MAX_TOKENS, TIMEOUT, ENVIRONMENT_ERROR = "done", "max_turns", "max_tokens", "timeout", "environment_error"
END_REASONS = (DONE, MAX_TURNS, MAX_TOKENS, TIMEOUT, ENVIRONMENT_ERROR)
"""Why an episode ends (`Trajectory.end_reason`); every reason but `done` scores 0."""


@dataclass(kw_only=True)
class EpisodeResult(Generation):
    """A finished episode: a `Generation` whose response interleaves the model's turns and the observations."""

    observation_starts: list[int] = field(default_factory=list)
    observation_ends: list[int] = field(default_factory=list)
    turn_ends: list[int] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    reward: float = 0.0
    """The sum of the turn rewards (0 unless the episode ended `done`)."""
    end_reason: str = DONE
    environment_s: float = 0.0
    """Seconds its environment calls took."""
    seconds: float = 0.0
    """Wall seconds from its start to its end."""
    tools: list = field(default_factory=list)
    """The `ToolOutcome`s of its steps."""
    context: list[int] = field(default_factory=list)
    """The prompt as the model saw it (the chat template's rendering, the environment's opening messages
    included): the trajectory's prompt_token_ids."""

    @property
    def model_tokens(self) -> int:
        return len(self.token_ids) - sum(e - s for s, e in zip(self.observation_starts, self.observation_ends))

    @property
    def turns(self) -> int:
        return len(self.turn_ends)


class Episode:
    """An episode in flight: the prompt's context, then the response tokens so far."""

    def __init__(self, *, key, prompt, context: list[int], session):
        self.key = key
        self.prompt = prompt
        self.context = context
        self.session = session
        self.started = time.monotonic()
        self.token_ids: list[int] = []
        self.logp_behav: list[float] = []
        self.weight_version: list[int] = []
        self.observation_starts: list[int] = []
        self.observation_ends: list[int] = []
        self.turn_ends: list[int] = []
        self.turn_rewards: list[float] = []
        self.environment_s = 0.0
        self.tools: list = []
        self.last_turn_finished = False
        self.seed: int | None = None
        """Where its turns' sampling seeds come from (`model.determinism`); None: the engine's generator."""

    @property
    def turns(self) -> int:
        return len(self.turn_ends)

    def full_context(self) -> list[int]:
        return self.context + self.token_ids

    def add_turn(self, gen: Generation, max_tokens: int) -> bool:
        """Append a sampled turn, cut to `max_tokens` response tokens in all; False when it was cut there."""
        room = max_tokens - len(self.token_ids)
        take = min(room, len(gen.token_ids))
        self.token_ids += gen.token_ids[:take]
        self.logp_behav += gen.logp_behav[:take]
        self.weight_version += gen.weight_version[:take]
        self.turn_ends.append(len(self.token_ids))
        self.last_turn_finished = gen.finished and take == len(gen.token_ids)
        return take == len(gen.token_ids)

    def add_observation(self, ids: list[int], max_tokens: int) -> bool:
        """Append an observation's tokens (the version of the model token before them, logp 0); False, and
        nothing appended, when they would pass `max_tokens` response tokens."""
        if len(self.token_ids) + len(ids) > max_tokens:
            return False
        if ids:
            self.observation_starts.append(len(self.token_ids))
            self.token_ids += ids
            self.logp_behav += [0.0] * len(ids)
            self.weight_version += [self.weight_version[-1]] * len(ids)
            self.observation_ends.append(len(self.token_ids))
        return True

    def reward_turn(self, reward: float) -> None:
        self.turn_rewards.append(float(reward))

    def result(self, reason: str) -> EpisodeResult:
        """The record of the episode ended for `reason`; anything but `done` scores 0 (a turn without an
        environment answer scores 0 too)."""
        rewards = self.turn_rewards + [0.0] * (len(self.turn_ends) - len(self.turn_rewards))
        if reason != DONE:
            rewards = [0.0] * len(self.turn_ends)
        return EpisodeResult(
            token_ids=self.token_ids, logp_behav=self.logp_behav, weight_version=self.weight_version,
            finished=reason == DONE, observation_starts=self.observation_starts,
            observation_ends=self.observation_ends, turn_ends=self.turn_ends, turn_rewards=rewards,
            reward=sum(rewards), end_reason=reason, environment_s=self.environment_s, tools=self.tools,
            seconds=time.monotonic() - self.started,
            context=list(self.context))
