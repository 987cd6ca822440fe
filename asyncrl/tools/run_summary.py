"""The end of `asyncrl up`: each run's audit, summary (`<run_dir>/summary.json`) and plot, printed; with `runs:`,
every run's, removed ones too, and the deployment's summary listing them."""

from __future__ import annotations

import json
from pathlib import Path

from asyncrl.core.config.runs import run_configs
from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.core.records import Record
from asyncrl.core.records.learner import Eval, Step
from asyncrl.core.runtime.events import read_records
from asyncrl.tools.plot_later import plot_later


def finish(cfg: AsyncRLConfig) -> None:
    """Audit and a summary of the run, printed and written to <run_dir>/summary.json; the plot is drawn by a
    process of its own that outlives `up` (`plot_later`). With `runs:`, each run's in its own directory, and
    the deployment's summary.json lists them."""
    runs = run_configs(cfg, removed=True)
    if not runs:
        finish_run(cfg)
        return
    summaries = {run: finish_run(run_cfg, f"run {run}: ") for run, run_cfg in runs.items()}
    Path(cfg.run_dir, "summary.json").write_text(json.dumps({"run_dir": cfg.run_dir, "runs": summaries}, indent=2))


def finish_run(cfg: AsyncRLConfig, label: str = "") -> dict:
    """One run's audit, summary (<run_dir>/summary.json, returned) and plot; its lines start with `label`."""
    from asyncrl.tools.audit import audit_run, surviving

    events = surviving(read_records(cfg.run_dir, "learner"))
    report = audit_run(cfg.run_dir)
    accuracy, line = accuracy_summary(events)
    plot = plot_later(cfg.run_dir)
    summary = {"run_dir": cfg.run_dir, **accuracy, "audit": report.as_dict(), "plot": str(plot)}
    Path(cfg.run_dir, "summary.json").write_text(json.dumps(summary, indent=2))
    if line:
        print(f"[up] {label}{line}", flush=True)
    verdict = "OK" if report.ok else "INCOMPLETE" if report.intact else "FAILED"
    print(f"[up] {label}audit {verdict}: {report.headline()}", flush=True)
    for reason in report.failures():
        print(f"[up] {label}  {'failed' if verdict == 'FAILED' else 'why'}: {reason}", flush=True)
    print(f"[up] {label}plot {plot} (drawn in the next seconds; {Path(cfg.run_dir) / 'logs' / 'plot.log'} says "
          "why if it does not appear)", flush=True)
    return summary


def accuracy_summary(events: list[Record]) -> tuple[dict, str | None]:
    """The held-out accuracy of a run from its learner events: (summary fields, console line or None without
    any evaluation). The line names the steps it compares, and says so when the run trained past its last
    evaluation (a run stopped before its last step: `up` interrupted, or a learner out of restarts), so a first
    evaluation is never shown as the result of the training after it."""
    evals = [e for e in events if isinstance(e, Eval)]
    last_step = max((e.step for e in events if isinstance(e, Step)), default=0)
    fields = {"eval_first": evals[0].accuracy if evals else None,
              "eval_last": evals[-1].accuracy if evals else None,
              "eval_first_step": evals[0].step if evals else None,
              "eval_last_step": evals[-1].step if evals else None, "last_step": last_step}
    if not evals:
        return fields, None
    first, last = evals[0], evals[-1]
    line = f"greedy accuracy {first.accuracy:.3f} at step {first.step}"
    if last is not first:
        gain = (last.accuracy - first.accuracy) * 100
        line += f" -> {last.accuracy:.3f} at step {last.step} ({gain:+.1f} points)"
    if last_step > last.step:
        line += f"; trained to step {last_step}, not evaluated there"
    return fields, line
