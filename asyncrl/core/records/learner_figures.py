"""The figures the learner reports to the controller after each step, declared once: each names its key on the
wire (`LearnerHeartbeatRequest.figures`), the step metric it is read from, the range the controller accepts,
and how the status page shows it. The learner's heartbeat, the controller's check, its history and status page,
and the learner's Prometheus diagnostics all read this table; a new figure is a row here and its producer.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.core.checks.validation import MAX_COUNT, MAX_REWARD, MAX_TIMEOUT_S


@dataclass(frozen=True)
class LearnerFigure:
    name: str
    """Its key in the heartbeat's `figures`, the status page's view and its history."""
    metric: str
    """The key of the learner's step metrics it is read from ("": the learner's loop sets it itself)."""
    low: float
    high: float
    """The range the controller accepts (INVALID_ARGUMENT naming `figures[name]` outside it)."""
    label: str
    """How the status page names it."""
    fmt: str
    """How the status page writes its value."""
    chart: str = ""
    """The title of the status page's chart of it by step ("": not charted)."""


FIGURES: tuple[LearnerFigure, ...] = (
    LearnerFigure("reward_mean", "reward/mean", -MAX_REWARD, MAX_REWARD, "reward", "{:.3f}", "reward (mean)"),
    LearnerFigure("eval_accuracy", "", 0.0, 1.0, "held-out accuracy", "{:.3f}", "held-out greedy accuracy"),
    LearnerFigure("staleness_mean", "staleness/mean", 0.0, 1e9, "staleness", "{:.2f}", "staleness (mean versions)"),
    LearnerFigure("step_seconds", "", 0.0, MAX_TIMEOUT_S, "step", "{:.2f} s", "seconds per step"),
    LearnerFigure("busy_fraction", "", 0.0, 1.0, "training", "{:.0%} of the time"),
    LearnerFigure("length_correct_mean", "length/correct_mean", 0.0, MAX_COUNT, "correct length", "{:.0f} tokens",
                  "length of correct responses (tokens)"),
    LearnerFigure("length_incorrect_mean", "length/incorrect_mean", 0.0, MAX_COUNT, "incorrect length",
                  "{:.0f} tokens", "length of incorrect responses (tokens)"),
    LearnerFigure("truncated_fraction", "length/truncated_frac", 0.0, 1.0, "truncated", "{:.0%}",
                  "share cut at max_new_tokens"),
    LearnerFigure("episode_turns_mean", "episode/turns_mean", 0.0, MAX_COUNT, "turns per episode", "{:.2f}",
                  "model turns per episode"),
    LearnerFigure("observation_tokens_mean", "episode/observation_tokens_mean", 0.0, MAX_COUNT,
                  "environment tokens per episode", "{:.0f}"),
    LearnerFigure("environment_share", "episode/environment_share", 0.0, 1.0, "episode time in the environment",
                  "{:.0%}"),
    LearnerFigure("tool_failure_fraction", "episode/tool_failure_frac", 0.0, 1.0, "tool calls failed", "{:.0%}"),
)
"""In the order the status page shows them."""

BY_NAME: dict[str, LearnerFigure] = {figure.name: figure for figure in FIGURES}
STEP_METRICS: frozenset[str] = frozenset(figure.metric for figure in FIGURES if figure.metric)
"""The step metrics some figure is read from."""


def figures_of(metrics: dict) -> dict[str, float]:
    """The figures a step's metrics carry (those its batch had: an episode figure only in multi-turn runs)."""
    return {f.name: float(metrics[f.metric]) for f in FIGURES if f.metric and metrics.get(f.metric) is not None}
