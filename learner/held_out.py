"""Held-out evaluation of the learner's own model with the task's reward: greedy accuracy (the mean greedy
reward; the fraction solved for 0/1 rewards) and, when configured, pass@k from `eval_samples` samples per
prompt, more for the prompts none of them solved (a sample counts as solved when its reward is >= 1)."""

from __future__ import annotations

import functools

import torch

from asyncrl.core.engines.torch_decode import generate_with_model
from asyncrl.core.model.modeling import eos_token_ids, pad_token_id
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.core.tasks.evaluate import greedy_accuracy, own_rewards
from asyncrl.learner.algos.evaluation import pass_at_k_scores

SOLVED = 1.0


def evaluate_held_out(model, task, sampling: SamplingParams, pass_k: int = 0, samples: int = 1,
                      samples_max: int = 0, large_k: int = 0, episodes=None, on_model=None,
                      prompts=None, score=None) -> dict[str, float]:
    """{"accuracy": ...} plus, when pass_k > 0, the pass@k figures (`pass_at_k_scores`) and "eval/samples"
    (samples drawn). Dynamic N: a prompt not solved by its first `samples` gets `samples` more at a time, up
    to `samples_max` (0: no more), so the hard tail that decides pass@k at large k is measured where it is.
    With `episodes` (multi-turn), the accuracy is the mean reward of the greedy episodes.
    (generate_with_model puts the model in eval mode and back.) `on_model(fn)`: how each generation is run
    where several runs share the model (`learner.runs`: on the base's thread); the rewards are scored here, so
    a reward that hangs holds its own run only. `prompts`: the held-out prompts to evaluate (the first
    `learner.eval_prompts`; None: the whole held-out set). `score`: how responses are scored (the learner's
    `RewardPool`, so a reward past `reward.timeout_s` scores 0 and one that hangs for good fails the evaluation
    rather than holding the run forever; None: the task's reward, called here)."""
    score = score or own_rewards(task)
    prompts = task.eval_prompts() if prompts is None else prompts
    generate = functools.partial(torch.no_grad()(generate_with_model), model, eos_ids=eos_token_ids(model),
                                 pad_id=pad_token_id(model))
    if on_model is not None:
        on_own_thread = generate

        def generate(*args, **kwargs):
            return on_model(functools.partial(on_own_thread, *args, **kwargs))
    with torch.no_grad():
        result = {"accuracy": greedy_accuracy(generate, task, prompts, sampling.max_new_tokens, episodes, score)}
        if pass_k:

            def draw(indices: list[int]) -> list[int]:
                groups = generate([prompts[i].token_ids for i in indices], sampling, samples)
                rewards = score([(task.decode_response(g.token_ids), prompts[i].metadata)
                                 for i, group in zip(indices, groups) for g in group])
                return [sum(r >= SOLVED for r in rewards[at : at + samples]) for at in range(0, len(rewards), samples)]

            solved, drawn = draw_until_solved(draw, len(prompts), samples, samples_max)
            result.update(pass_at_k_scores(solved, drawn, pass_k, large_k))
            result["eval/samples"] = float(sum(drawn))
    return result


def draw_until_solved(draw, prompts: int, samples: int, samples_max: int) -> tuple[list[int], list[int]]:
    """(solved, drawn) per prompt: `samples` each, then `samples` more at a time for those none solved yet while
    they stay within `samples_max`. `draw(indices)` samples `samples` for each index and returns how many solved."""
    solved, drawn = [0] * prompts, [0] * prompts
    todo = list(range(prompts))
    while todo:
        for i, count in zip(todo, draw(todo)):
            drawn[i] += samples
            solved[i] += count
        todo = [i for i in todo if solved[i] == 0 and drawn[i] + samples <= samples_max]
    return solved, drawn
