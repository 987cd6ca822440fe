"""How much of its time the learner trains: the figure asynchrony is for. A learner that waits for data (the
rollouts cannot keep up, η holds them back) or for its push shows it here before it shows in the run's wall
time; the console line, the status page, the `asyncrl_learner_busy_ratio` gauge and an alert read it."""

from __future__ import annotations

from collections import deque

WINDOW_STEPS = 20
"""Steps the fraction is over: long enough to smooth one slow batch, short enough to follow a change of
pace (a replica lost, an evaluation) within a minute of a demo-sized run."""


class BusyMeter:
    """The fraction of the wall time of the last `window` steps spent in train steps. A step's wall time
    runs from the end of the step before (waiting for data, assembling, evaluating and checkpointing
    included) to the end of its own push."""

    def __init__(self, window: int = WINDOW_STEPS):
        if window < 1:
            raise ValueError(f"window must be >= 1 step, got {window}")
        self._steps: deque[tuple[float, float]] = deque(maxlen=window)

    def add(self, train_s: float, wall_s: float) -> float:
        """Record one step (its train time and its wall time); returns the fraction over the window."""
        if train_s < 0 or wall_s < 0:
            raise ValueError(f"times must be >= 0, got train_s={train_s}, wall_s={wall_s}")
        # A wall time below the train time is clock noise (two clocks, one step): the step was all training.
        self._steps.append((train_s, max(train_s, wall_s)))
        return self.fraction()

    def fraction(self) -> float | None:
        """Training time / wall time over the window; None before the first step (or for zero wall time)."""
        wall = sum(w for _, w in self._steps)
        return sum(t for t, _ in self._steps) / wall if wall > 0 else None
