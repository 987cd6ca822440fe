"""The learner's busy fraction (`learner.busy`): train time over wall time of its last steps, by hand."""

import pytest

from asyncrl.learner.busy import BusyMeter


def test_the_fraction_is_train_time_over_wall_time_of_the_window():
    meter = BusyMeter(window=3)
    assert meter.fraction() is None
    assert meter.add(0.02, 0.04) == pytest.approx(0.5)
    assert meter.add(0.03, 0.03) == pytest.approx(0.05 / 0.07)
    assert meter.add(0.01, 0.05) == pytest.approx(0.06 / 0.12)
    # The first step leaves the window: (0.03 + 0.01 + 0.04) / (0.03 + 0.05 + 0.04).
    assert meter.add(0.04, 0.04) == pytest.approx(0.08 / 0.12)


def test_a_long_wait_weighs_by_its_time_not_as_one_step():
    meter = BusyMeter(window=20)
    for _ in range(19):
        meter.add(0.02, 0.02)
    # An evaluation of 1.6 s between two steps: the learner trained 0.4 s of the last 2 s.
    assert meter.add(0.02, 1.62) == pytest.approx(0.4 / 2.0)


def test_a_wall_time_below_the_train_time_counts_as_all_training():
    meter = BusyMeter(window=2)
    assert meter.add(0.05, 0.049) == pytest.approx(1.0)
    assert meter.add(0.0, 0.0) == pytest.approx(1.0)  # a zero-length step changes nothing
    assert BusyMeter(window=1).add(0.0, 0.0) is None


@pytest.mark.parametrize(("train_s", "wall_s"), [(-0.1, 1.0), (0.1, -1.0)])
def test_negative_times_are_refused(train_s, wall_s):
    with pytest.raises(ValueError, match="times must be >= 0"):
        BusyMeter().add(train_s, wall_s)


def test_an_empty_window_is_refused():
    with pytest.raises(ValueError, match="window must be >= 1"):
        BusyMeter(window=0)
