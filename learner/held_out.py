"""Held-out evaluation of the learner's own model with the task's reward: greedy accuracy (the mean greedy
reward; the fraction solved for 0/1 rewards) and, when configured, the unbiased pass@k estimate from
`eval_samples` samples per prompt (a sample counts as solved when its reward is >= 1)."""

from __future__ import annotations

import functools

import torch

from asyncrl.core.engines.torch_decode import generate_with_model
from asyncrl.core.modeling import eos_token_ids, pad_token_id
from asyncrl.core.sampling import SamplingParams
from asyncrl.core.tasks.evaluate import greedy_accuracy
from asyncrl.learner.algos import pass_at_k

SOLVED = 1.0


def evaluate_held_out(model, task, sampling: SamplingParams, pass_k: int = 0, samples: int = 1) -> dict[str, float]:
    """{"accuracy": ...} plus {"pass@k": ...} when pass_k > 0 (generate_with_model puts the model in eval mode
    and back)."""
    generate = functools.partial(generate_with_model, model, eos_ids=eos_token_ids(model), pad_id=pad_token_id(model))
    with torch.no_grad():
        result = {"accuracy": greedy_accuracy(generate, task, max_new_tokens=sampling.max_new_tokens)}
        if pass_k:
            prompts = task.eval_prompts()
            groups = generate([p.token_ids for p in prompts], sampling, samples)
            estimates = []
            for prompt, group in zip(prompts, groups):
                solved = sum(task.reward(task.decode_response(g.token_ids), prompt.metadata) >= SOLVED for g in group)
                estimates.append(pass_at_k(samples, solved, pass_k))
            result[f"pass@{pass_k}"] = sum(estimates) / len(estimates)
    return result
