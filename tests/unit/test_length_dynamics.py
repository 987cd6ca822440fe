"""Length dynamics against values worked out by hand from the definitions (learner/algos/length_dynamics.py)."""

from __future__ import annotations

import pytest
import torch

from asyncrl.learner.algos.groups import Groups
from asyncrl.learner.algos.length_dynamics import length_dynamics

LENGTHS = torch.tensor([2.0, 4.0, 6.0, 8.0])
CORRECT = torch.tensor([True, False, True, False])
TWO_GROUPS = Groups.of(torch.tensor([0, 0, 1, 1]))


def figures(aggregation="token-mean", **kwargs):
    return {k: float(v) for k, v in length_dynamics(LENGTHS, CORRECT, TWO_GROUPS, aggregation, **kwargs).items()}


def test_correct_and_incorrect_lengths_and_the_truncated_share():
    m = figures(finished=torch.tensor([True, True, True, False]))
    assert m["length/correct_mean"] == 4.0  # (2 + 6) / 2
    assert m["length/incorrect_mean"] == 6.0  # (4 + 8) / 2
    assert m["length/truncated_frac"] == 0.25
    # Both groups pass half the time: neither easy nor hard, and no mean over an empty set.
    assert (m["length/easy_frac"], m["length/hard_frac"]) == (0.0, 0.0)
    assert "length/easy_mean" not in m and "length/hard_mean" not in m


def test_without_finish_flags_there_is_no_truncation_figure():
    assert "length/truncated_frac" not in figures()


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-sum"])
def test_token_mean_and_dr_grpo_weigh_every_token_alike(aggregation):
    m = figures(aggregation)
    assert m["length/token_weight_long_vs_short"] == 1.0
    assert m["length/token_weight_incorrect_vs_correct"] == 1.0


def test_original_grpo_weighs_a_token_of_a_long_response_less():
    m = figures("seq-mean-token-mean")
    # Median 4 (the lower middle): longer = {6, 8}, shorter = {2, 4}. A token weighs 1/L: the mean weight of a
    # longer token is (6/6 + 8/8) / 14 = 1/7, of a shorter one (2/2 + 4/4) / 6 = 1/3; ratio 3/7.
    assert m["length/token_weight_long_vs_short"] == pytest.approx(3 / 7)
    # Incorrect {4, 8}: 2/12 = 1/6; correct {2, 6}: 2/8 = 1/4; ratio 2/3 (the longer incorrect answers are
    # penalised less per token: Dr.GRPO's bias).
    assert m["length/token_weight_incorrect_vs_correct"] == pytest.approx(2 / 3)


def test_rows_the_loss_does_not_see_leave_the_weights():
    # Without the 8-token row: median of {2, 4, 6} is 4, longer = {6}: 1/6 against (1 + 1) / 6 = 1/3.
    m = figures("seq-mean-token-mean", trained=torch.tensor([True, True, True, False]))
    assert m["length/token_weight_long_vs_short"] == pytest.approx(0.5)
    assert m["length/token_weight_incorrect_vs_correct"] == pytest.approx((1 / 4) / (2 / 8))


def test_easy_and_hard_prompts_by_their_groups_pass_rate():
    lengths = torch.tensor([3.0, 3.0, 5.0, 5.0, 10.0, 20.0, 30.0, 40.0, 7.0, 9.0, 11.0, 13.0])
    correct = torch.tensor([True] * 4 + [False] * 4 + [True, True, False, False])
    groups = Groups.of(torch.tensor([0] * 4 + [1] * 4 + [2] * 4))
    m = {k: float(v) for k, v in length_dynamics(lengths, correct, groups, "token-mean").items()}
    assert m["length/easy_mean"] == 4.0 and m["length/hard_mean"] == 25.0
    assert m["length/easy_frac"] == pytest.approx(1 / 3) and m["length/hard_frac"] == pytest.approx(1 / 3)
    assert m["length/correct_mean"] == pytest.approx((3 + 3 + 5 + 5 + 7 + 9) / 6)


def test_an_empty_batch_has_no_figures_and_an_unknown_aggregation_is_an_error():
    assert length_dynamics(torch.zeros(0), torch.zeros(0, dtype=torch.bool), Groups.of(torch.zeros(0)),
                           "token-mean") == {}
    with pytest.raises(ValueError, match="seq-sum"):
        length_dynamics(LENGTHS, CORRECT, TWO_GROUPS, "seq-sum")
