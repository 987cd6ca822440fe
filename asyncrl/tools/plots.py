"""PNG plots of a run from its event logs: reward and held-out accuracy with the share of the time the
learner trains, staleness over steps and its histogram, the behaviour/proximal mismatch with the push time,
and the length dynamics (length of correct and incorrect responses, of easy and hard prompts, the truncated
share; how the loss aggregation weighs the tokens of long and incorrect responses)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from asyncrl.core.records.learner import Eval, Step, WeightsPushed
from asyncrl.core.runtime.events import read_records
from asyncrl.tools.audit import surviving
from asyncrl.tools.plot_later import run_plot_path


def plot_run(run_dir: str | Path) -> Path:
    learner = surviving(read_records(run_dir, "learner"))
    steps = [e for e in learner if isinstance(e, Step)]
    evals = [e for e in learner if isinstance(e, Eval)]
    if not steps and not evals:
        raise ValueError(f"{run_dir}: no learner steps or evals to plot")
    fig, axes = plt.subplots(2, 3, figsize=(16, 7.5))
    x = [e.step for e in steps]

    ax = axes[0][0]
    ax.plot(x, [e.metrics["reward/mean"] for e in steps], label="train reward (batch mean)", color="tab:blue")
    ax.plot([e.step for e in evals], [e.accuracy for e in evals], "o-", label="greedy held-out accuracy",
            color="tab:green")
    busy = [(e.step, e.metrics["time/busy"]) for e in steps if e.metrics.get("time/busy") is not None]  # older logs
    if busy:
        ax.plot(*zip(*busy), label="learner busy (share of wall time training)", color="tab:gray", alpha=0.7)
    ax.set_xlabel("learner step")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("reward, accuracy, learner busy")
    ax.legend(loc="lower right")

    ax = axes[0][1]
    ax.plot(x, [e.metrics["staleness/mean"] for e in steps], label="mean", color="tab:orange")
    ax.plot(x, [e.metrics["staleness/max"] for e in steps], label="max", color="tab:red", linestyle="--")
    ax.set_xlabel("learner step")
    ax.set_ylabel("version - oldest token version")
    ax.set_title("staleness of consumed trajectories")
    ax.legend()

    ax = axes[1][0]
    hist: dict[int, int] = {}
    for e in steps:
        for k, v in e.metrics.get("staleness/hist", {}).items():
            hist[int(k)] = hist.get(int(k), 0) + v
    if hist:
        ax.bar(list(hist), list(hist.values()), color="tab:orange")
    ax.set_xlabel("staleness (versions)")
    ax.set_ylabel("trajectories")
    ax.set_title("staleness histogram")

    ax = axes[1][1]
    kl_key = next((k for k in ("rc/kl_k3", "rc/kl_k1") if steps and k in steps[0].metrics), None)
    if kl_key:
        ax.plot(x, [e.metrics[kl_key] for e in steps], label=f"KL(behav||prox) {kl_key}", color="tab:purple")
        ax.set_ylabel("KL")
    ax2 = ax.twinx()
    # A push carries the version a step produced; step k produces version k on one timeline.
    step_of = {e.version: e.step for e in steps}
    pushes = [e for e in learner if isinstance(e, WeightsPushed) and e.version in step_of]
    ax2.plot([step_of[e.version] for e in pushes], [e.push_s for e in pushes], label="weight push s",
             color="tab:gray", alpha=0.6)
    ax2.plot(x, [e.push_wait_s for e in steps], label="push on the learner's path s",
             color="black", alpha=0.6, linestyle=":")
    ax2.set_ylabel("push seconds")
    ax.set_xlabel("learner step")
    ax.set_title("mismatch and weight push")
    lines = ax.get_lines() + ax2.get_lines()
    ax.legend(lines, [ln.get_label() for ln in lines], loc="upper right")

    _plot_lengths(axes[0][2], steps)
    _plot_token_weights(axes[1][2], steps)
    fig.suptitle(f"asyncrl run {Path(run_dir).name}")
    fig.tight_layout()
    out = run_plot_path(run_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def _series(steps: list[Step], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the steps that report `key` (a batch without correct answers has no correct length)."""
    points = [(e.step, e.metrics[key]) for e in steps if e.metrics.get(key) is not None]
    return [s for s, _ in points], [v for _, v in points]


def _plot_lengths(ax, steps: list[Step]) -> None:
    for key, label, style in (("length/correct_mean", "correct", "-"), ("length/incorrect_mean", "incorrect", "-"),
                              ("length/easy_mean", "easy prompts (group passes > 90%)", "--"),
                              ("length/hard_mean", "hard prompts (group passes < 10%)", "--")):
        ax.plot(*_series(steps, key), style, label=label)
    ax.set_xlabel("learner step")
    ax.set_ylabel("response tokens (batch mean)")
    ax2 = ax.twinx()
    ax2.plot(*_series(steps, "length/truncated_frac"), ":", color="black", alpha=0.6,
             label="share cut at max_new_tokens")
    ax2.set_ylim(-0.02, 1.02)
    ax2.set_ylabel("truncated share")
    ax.set_title("response length")
    lines = ax.get_lines() + ax2.get_lines()
    ax.legend(lines, [ln.get_label() for ln in lines], loc="best", fontsize="small")


def _plot_token_weights(ax, steps: list[Step]) -> None:
    ax.plot(*_series(steps, "length/token_weight_long_vs_short"), label="long vs short responses")
    ax.plot(*_series(steps, "length/token_weight_incorrect_vs_correct"), label="incorrect vs correct responses")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xlabel("learner step")
    ax.set_ylabel("mean weight of a token, ratio")
    ax.set_title("how the loss aggregation weighs tokens (1: alike)")
    ax.legend(loc="lower right", fontsize="small")
