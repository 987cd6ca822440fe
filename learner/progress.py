"""Where the learner is: its step, version and the last step's figures, as its status RPC, its heartbeat to
the controller (the status page) and `asyncrl up`'s progress lines show them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LearnerProgress:
    step: int = 0
    version: int = 0
    consumed: int = 0
    last_reward_mean: float = 0.0
    last_eval_accuracy: float = -1.0
    last_step_s: float = 0.0
    last_staleness_mean: float = 0.0
    last_wall_s: float = 0.0
    """Wall time from the end of the previous step to the end of this one (waiting for data included)."""
    busy_fraction: float | None = None
    """Train time / wall time over the last `learner.busy.WINDOW_STEPS` steps (None before the first)."""
    data_position: int = 0
    """One past the highest prompt index trained on."""
    length_correct_mean: float | None = None
    """Mean length of the last batch's correct responses, in tokens (None: it had none)."""
    length_incorrect_mean: float | None = None
    """Mean length of the last batch's incorrect responses, in tokens (None: it had none)."""
    truncated_fraction: float | None = None
    """Share of the last batch's responses cut at max_new_tokens (None: not known)."""
    episode_turns_mean: float | None = None
    """Multi-turn runs: the last batch's mean model turns per episode (None: single-turn)."""
    observation_tokens_mean: float | None = None
    """Multi-turn runs: the last batch's mean environment tokens per episode."""
    environment_share: float | None = None
    """Multi-turn runs: the last batch's share of episode time spent in environment calls."""
    tool_failure_fraction: float | None = None
    """Multi-turn runs: the share of the last batch's tool calls that failed (None: it made none)."""

    def take_figures(self, metrics: dict) -> None:
        """The figures of the step just trained (`Trainer.step`'s metrics)."""
        self.last_reward_mean = metrics["reward/mean"]
        self.last_step_s = metrics["time/step_s"]
        self.last_staleness_mean = metrics.get("staleness/mean", 0.0)
        self.length_correct_mean = metrics.get("length/correct_mean")
        self.length_incorrect_mean = metrics.get("length/incorrect_mean")
        self.truncated_fraction = metrics.get("length/truncated_frac")
        self.episode_turns_mean = metrics.get("episode/turns_mean")
        self.observation_tokens_mean = metrics.get("episode/observation_tokens_mean")
        self.environment_share = metrics.get("episode/environment_share")
        self.tool_failure_fraction = metrics.get("episode/tool_failure_frac")
