"""Where the learner is: its step, version and the last step's figures, as its status RPC, its heartbeat to
the controller (the status page) and `asyncrl up`'s progress lines show them."""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncrl.core.records.learner_figures import figures_of


@dataclass
class LearnerProgress:
    step: int = 0
    version: int = 0
    consumed: int = 0
    last_eval_accuracy: float = -1.0
    last_step_s: float = 0.0
    last_wall_s: float = 0.0
    """Wall time from the end of the previous step to the end of this one (waiting for data included)."""
    busy_fraction: float | None = None
    """Train time / wall time over the last `learner.busy.WINDOW_STEPS` steps (None before the first)."""
    data_position: int = 0
    """One past the highest prompt index trained on."""
    step_figures: dict[str, float] = field(default_factory=dict)
    """The last step's figures read from its metrics, by name (`asyncrl.core.records.learner_figures`)."""

    @property
    def last_reward_mean(self) -> float:
        return self.step_figures.get("reward_mean", 0.0)

    def take_figures(self, metrics: dict) -> None:
        """The figures of the step just trained (`Trainer.step`'s metrics)."""
        self.last_step_s = metrics["time/step_s"]
        self.step_figures = figures_of(metrics)

    def figures(self) -> dict[str, float]:
        """Every figure there is to report, by name: the step's, its wall time and busy share, the last
        held-out accuracy."""
        if self.step == 0:
            return {}
        figures = {**self.step_figures, "step_seconds": self.last_wall_s}
        if self.busy_fraction is not None:
            figures["busy_fraction"] = self.busy_fraction
        if self.last_eval_accuracy >= 0:
            figures["eval_accuracy"] = self.last_eval_accuracy
        return figures
