"""Scoring with shared prompts (`asyncrl.core.engines.prefix_scoring`): each distinct prompt runs once, and
the log-probs equal the one-forward `sequence_logprobs` to float rounding."""

import pytest
import torch

from asyncrl.core.engines.prefix_scoring import shared_prompt_logprobs
from asyncrl.core.modeling import load_causal_lm, sequence_logprobs

# Prompts of different lengths (left padding), responses of different lengths (right padding).
PROMPTS = [[1, 5, 6, 14, 7, 8, 15], [1, 9, 14, 9, 15], [1, 12, 13, 14, 4, 15]]


def groups(samples: int):
    sequences, starts = [], []
    for j, prompt in enumerate(PROMPTS):
        for k in range(samples):
            sequences.append(prompt + [3 + (k + j) % 10] * (1 + k % 4) + [2])
            starts.append(len(prompt))
    return sequences, starts


@pytest.mark.parametrize("samples", [1, 4])
def test_shared_prompts_score_as_one_forward_does(tiny_model_dir, samples):
    model = load_causal_lm(tiny_model_dir.teacher)
    sequences, starts = groups(samples)
    with torch.no_grad():
        expected, expected_mask = sequence_logprobs(model, sequences, starts, None, pad_id=0)
    logp, mask = shared_prompt_logprobs(model, sequences, starts, pad_id=0)
    assert torch.equal(mask, expected_mask)
    assert torch.allclose(logp, expected, atol=2e-5)
    assert (logp[~mask] == 0).all()


def test_each_distinct_prompt_runs_once(tiny_model_dir, monkeypatch):
    model = load_causal_lm(tiny_model_dir.teacher)
    shapes = []
    forward = model.base_model.forward

    def counting(*args, **kwargs):
        shapes.append(tuple(kwargs["input_ids"].shape))
        return forward(*args, **kwargs)

    monkeypatch.setattr(model.base_model, "forward", counting)
    sequences, starts = groups(4)
    shared_prompt_logprobs(model, sequences, starts, pad_id=0)
    longest_prompt, longest_response = max(map(len, PROMPTS)), max(len(s) - b for s, b in zip(sequences, starts))
    assert shapes == [(len(PROMPTS), longest_prompt), (len(sequences), longest_response)]


@pytest.mark.parametrize("start", [0, -2, 99])
def test_a_response_start_outside_the_sequence_is_refused(tiny_model_dir, start):
    model = load_causal_lm(tiny_model_dir.teacher)
    sequences, starts = groups(2)
    starts[1] = start
    with pytest.raises(ValueError, match="response_start"):
        shared_prompt_logprobs(model, sequences, starts, pad_id=0)
