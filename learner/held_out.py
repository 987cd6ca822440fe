"""Held-out evaluation of the learner's own model (greedy accuracy on the task's held-out prompts)."""

from __future__ import annotations

import functools

import torch

from asyncrl.core.engines.torch_decode import generate_with_model
from asyncrl.core.modeling import eos_token_ids, pad_token_id
from asyncrl.core.tasks.evaluate import greedy_accuracy


def evaluate_greedy(model, task, max_new_tokens: int) -> float:
    """Greedy accuracy of the learner's own model on the task's held-out prompts (generate_with_model puts the
    model in eval mode and back)."""
    generate = functools.partial(generate_with_model, model, eos_ids=eos_token_ids(model), pad_id=pad_token_id(model))
    with torch.no_grad():
        return greedy_accuracy(generate, task, max_new_tokens=max_new_tokens)
