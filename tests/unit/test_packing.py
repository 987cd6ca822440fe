"""Packed rows (`asyncrl.core.model.packing`): plans and costs against hand-computed values, the layout of a row, its
mask, and the choice among the layouts (`prompt_sharing.choose_layout`)."""

import pytest
import torch

from asyncrl.core.model.modeling import load_causal_lm, sequence_logprobs
from asyncrl.core.model.packing import (
    attention_mask,
    lay_out,
    least_filled,
    pair_cost,
    plan_rows,
    row_cap,
    rows_cost,
    tree_parts,
    why_not_packed,
)
from asyncrl.core.model.prompt_sharing import choose_layout, layout_costs


def test_a_pair_costs_one_sixth_of_the_width_of_a_token():
    assert pair_cost(64) == pytest.approx(1 / 384)
    assert row_cap(64, 100) == 384 and row_cap(64, 500) == 500


def test_a_prompts_responses_are_cut_into_trees_that_fit_a_row():
    # 10 + 4 + 4 = 18 fits 20; a third response would make 22.
    assert tree_parts(10, {0: 4, 1: 4, 2: 4}, 20) == [[0, 1], [2]]
    assert tree_parts(10, {5: 30}, 20) == [[5]]  # too long alone: kept whole


def test_trees_go_longest_first_onto_the_least_filled_row():
    # 9 -> row 0, 5 -> row 1, 4 -> row 1 (9), 3 -> row 0 (the tie goes to the lower row).
    assert least_filled([5, 9, 3, 4], 2) == [[1, 2], [0, 3]]
    assert least_filled([5], 3) == [[0]]  # no empty rows


def test_rows_cost_their_padded_tokens_and_attended_pairs():
    assert rows_cost([3, 5], 0.1) == pytest.approx(2 * (5 + 0.1 * 25))
    assert rows_cost([], 0.1) == 0


def test_the_plan_takes_the_cheapest_row_count():
    # Prompts of 10 and 4 tokens; responses of 3, 5 (prompt 0) and 2 (prompt 1) take 2, 4, 1 positions.
    # Trees 16 and 5: one row costs 21 + 21^2/384 = 22.15, two rows 2 x (16 + 16^2/384) = 33.3.
    assert plan_rows([10, 4], [0, 0, 1], [3, 5, 2], 64) == [[(0, [0, 1]), (1, [2])]]
    # Trees of 300, 100, 100, 100 (a row holds 384): two rows of 300 cost 2 x (300 + 300^2/384) = 1068.75,
    # three (300, 200, 100) 3 x 534.4 = 1603, four 2137; one row of 600 is over the cap.
    assert plan_rows([299, 99, 99, 99], [0, 1, 2, 3], [2] * 4, 64) == [[(0, [0])], [(1, [1]), (2, [2]), (3, [3])]]
    # Trees of equal length: as many rows as trees (the same tokens, less attention).
    assert len(plan_rows([2] * 8, list(range(8)), [4] * 8, 2)) == 8


def test_layout_costs_by_hand():
    # As above, width 64: whole is 3 rows of 15; KV copy 2 prompts of 10, then 3 responses of 5 over 15 keys.
    costs = layout_costs([10, 4], [0, 0, 1], [3, 5, 2], 64)
    assert costs["whole"] == pytest.approx(3 * (15 + 225 / 384))
    assert costs["kv_copy"] == pytest.approx(2 * (10 + 100 / 384) + 3 * (5 + 5 * 15 / 384))
    assert costs["packed"] == pytest.approx(21 + 21 * 21 / 384)


def test_long_prompts_with_long_responses_keep_the_kv_copy():
    # Width 64, 8 groups of 8: 128-token prompts and 32-token responses make trees of 376 positions, one per
    # row, whose attention costs more than the KV copy's.
    prompt_of = [g for g in range(8) for _ in range(8)]
    costs = layout_costs([128] * 8, prompt_of, [32] * 64, 64)
    assert min(costs, key=costs.get) == "kv_copy"
    # Short prompts and uneven responses: packed rows skip the padding.
    costs = layout_costs([20] * 8, prompt_of, [2 + 10 * (i % 2) for i in range(64)], 64)
    assert min(costs, key=costs.get) == "packed"


def test_a_row_lays_out_prompts_once_and_responses_without_their_last_token():
    # Prompts A = [7, 8], B = [9]; sequences A+[10, 11], A+[12], B+[13, 14, 15].
    rows = lay_out([[(0, [0, 1]), (1, [2])]], [[7, 8], [9]], [[10, 11], [12], [13, 14, 15]], pad_id=0)
    assert rows.input_ids.tolist() == [[7, 8, 10, 9, 13, 14]]
    assert rows.position_ids.tolist() == [[0, 1, 2, 0, 1, 2]]
    assert rows.segment.tolist() == [[0, 0, 1, 3, 4, 4]]
    assert rows.tree.tolist() == [[0, 0, 0, 3, 3, 3]]
    # 10 <- A's last (1), 11 <- 10 (2); 12 <- A's last (1); 13 <- B (3), 14 <- 13 (4), 15 <- 14 (5).
    assert rows.predictors.tolist() == [1, 2, 1, 3, 4, 5]
    allowed = rows.allowed()[0].int().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 1, 1, 1],
    ]


def test_padding_attends_to_itself_alone():
    rows = lay_out([[(0, [0])], [(1, [1])]], [[7, 8, 9], [5]], [[10, 11], [12]], pad_id=0)
    assert rows.input_ids.tolist() == [[7, 8, 9, 10], [5, 0, 0, 0]]
    assert rows.segment.tolist() == [[0, 0, 0, 1], [0, -1, -1, -1]]
    assert rows.predictors.tolist() == [2, 3, 4]  # row 1 starts at flat index 4
    assert rows.allowed()[1].int().tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_eager_and_sdpa_attention_score_packed_rows_as_whole_sequences(tiny_model_dir, attention):
    """sdpa takes the boolean mask, eager an additive one: the same log-probs as one forward of each whole
    sequence."""
    from asyncrl.core.model.packing import packed_logprobs

    model = load_causal_lm(tiny_model_dir.teacher)
    model.set_attn_implementation(attention)
    sequences = [[1, 5, 6, 7, 3, 3, 2], [1, 5, 6, 7, 4, 2], [1, 9, 8, 5, 2]]
    starts = [4, 4, 3]
    mask = attention_mask(lay_out([[(0, [0, 1]), (1, [2])]], [[1, 5, 6, 7], [1, 9, 8]],
                                  [[3, 3, 2], [4, 2], [5, 2]], 0), model, "cpu")
    assert mask.dtype == (torch.bool if attention == "sdpa" else torch.float32)
    with torch.no_grad():
        expected, _ = sequence_logprobs(model, sequences, starts, None, pad_id=0)
        logp, _ = packed_logprobs(model, sequences, starts, None, 0)
    assert torch.allclose(logp, expected, atol=2e-5)


def test_bitwise_determinism_never_packs(tiny_model_dir):
    """The batch-invariant attention (`model.determinism: bitwise`) takes no packed mask: the learner keeps
    the KV copy, which the engines' prefill and decode reproduce bit for bit."""
    from asyncrl.core.determinism.invariant_model import use_invariant_kernels

    model = load_causal_lm(tiny_model_dir.policy)
    use_invariant_kernels(model)
    assert "attention implementation" in why_not_packed(model)
    sequences = [[1, 5, 6, 7, 3, 3, 2], [1, 5, 6, 7, 4, 2], [1, 9, 8, 5, 2], [1, 9, 8, 5, 5, 5, 5, 2]]
    assert choose_layout(model, sequences, [4, 4, 3, 3]) in ("kv_copy", "whole")
