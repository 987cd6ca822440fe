"""What `up` shows of a run from its learner event log: the console line per step (train time, the share of
the time the learner trains, push wait) and the run plot (the busy share on the reward panel); event logs
written before the busy share existed still show and plot."""

import pytest

from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.core.records.learner import Eval, Step
from asyncrl.core.runtime.events import EventLog
from asyncrl.tools import plots
from asyncrl.tools.supervisor import Progress


def write_steps(run_dir, busy: bool) -> None:
    log = EventLog(run_dir, "learner")
    for step in (1, 2):
        metrics = {"reward/mean": 0.25, "staleness/mean": 1.0, "staleness/max": 2, "staleness/hist": {"1": 64},
                   "time/step_s": 0.0234}
        if busy:
            metrics["time/busy"] = 0.5 + 0.25 * step
        log.write(Step(step=step, version=step, push_wait_s=0.0012, metrics=metrics))
    log.write(Eval(step=2, version=2, accuracy=0.5, seconds=1.0, by="learner"))
    log.close()


@pytest.mark.parametrize("busy", [True, False])
def test_the_console_line_gives_times_in_ms_and_the_busy_share(tmp_path, capsys, busy):
    write_steps(tmp_path, busy)
    config = AsyncRLConfig.model_validate({"run_dir": str(tmp_path), "learner": {"total_steps": 2}})
    Progress(config).poll()
    lines = [line for line in capsys.readouterr().out.splitlines() if " step " in line]
    share = " (100% of the time)" if busy else ""
    assert lines[1].endswith(f"staleness mean 1.00 max 2 train 23 ms{share}, push wait 1 ms"), lines[1]


@pytest.mark.parametrize("busy", [True, False])
def test_the_run_plot_draws_the_busy_share_where_the_log_has_it(tmp_path, monkeypatch, busy):
    write_steps(tmp_path, busy)
    figures = []
    monkeypatch.setattr(plots.plt, "close", figures.append)  # keep the figure to look at
    out = plots.plot_run(tmp_path)
    assert out.stat().st_size > 10_000
    reward_panel = figures[0].axes[0]
    curves = {line.get_label(): list(line.get_ydata()) for line in reward_panel.get_lines()}
    label = "learner busy (share of wall time training)"
    assert (curves.get(label) == [0.75, 1.0]) if busy else (label not in curves)


def test_the_final_accuracy_line_names_its_steps_and_a_run_that_trained_past_its_last_evaluation():
    from asyncrl.tools.run_summary import accuracy_summary

    def evaluation(step, accuracy):
        return Eval(step=step, version=step, accuracy=accuracy, seconds=1.0, by="learner")

    steps = [Step(step=s, version=s) for s in range(1, 5)]
    evaluated = [evaluation(0, 0.385), *steps, evaluation(4, 0.5)]
    fields, line = accuracy_summary(evaluated)
    assert line == "greedy accuracy 0.385 at step 0 -> 0.500 at step 4 (+11.5 points)"
    assert fields == {"eval_first": 0.385, "eval_last": 0.5, "eval_first_step": 0, "eval_last_step": 4,
                      "last_step": 4}
    # Interrupted before its final evaluation: the first one is not shown as the result of the training.
    fields, line = accuracy_summary([evaluation(0, 0.385), *steps])
    assert line == "greedy accuracy 0.385 at step 0; trained to step 4, not evaluated there"
    assert fields["eval_last_step"] == 0 and fields["last_step"] == 4
    fields, line = accuracy_summary(steps)
    assert line is None and fields["eval_first"] is None and fields["last_step"] == 4


def test_the_run_plot_draws_the_length_dynamics_and_leaves_gaps_where_a_batch_had_none(tmp_path, monkeypatch):
    log = EventLog(tmp_path, "learner")
    for step, correct in ((1, 12.0), (2, None), (3, 18.0)):  # step 2's batch had no correct response
        metrics = {"reward/mean": 0.25, "staleness/mean": 1.0, "staleness/max": 2, "time/step_s": 0.02,
                   "length/incorrect_mean": 30.0 + step, "length/truncated_frac": 0.1 * step,
                   "length/token_weight_incorrect_vs_correct": 0.5}
        if correct is not None:
            metrics["length/correct_mean"] = correct
        log.write(Step(step=step, version=step, push_wait_s=0.0, metrics=metrics))
    log.close()
    figures = []
    monkeypatch.setattr(plots.plt, "close", figures.append)
    plots.plot_run(tmp_path)
    axes = figures[0].axes
    length_panel = next(ax for ax in axes if ax.get_title() == "response length")
    curves = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in length_panel.get_lines()}
    assert curves["correct"] == ([1, 3], [12.0, 18.0]) and curves["incorrect"] == ([1, 2, 3], [31.0, 32.0, 33.0])
    truncated = next(line for ax in axes for line in ax.get_lines() if line.get_label() == "share cut at max_new_tokens")
    assert list(truncated.get_ydata()) == pytest.approx([0.1, 0.2, 0.3])
    weights = next(ax for ax in axes if ax.get_title().startswith("how the loss aggregation weighs"))
    ratios = {line.get_label(): list(line.get_ydata()) for line in weights.get_lines()}
    assert ratios["incorrect vs correct responses"] == [0.5, 0.5, 0.5]
