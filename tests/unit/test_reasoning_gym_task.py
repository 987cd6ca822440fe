"""The `reasoning_gym` task: config errors naming the key, the held-out split, the mixture, the prompt
template, and the reward (reasoning-gym's own verifier on the extracted answer)."""

from __future__ import annotations

import collections

import pytest
from pydantic import ValidationError

from asyncrl.core.config.data import TaskConfig
from asyncrl.core.model.tokenizer import ModelTokenizer
from asyncrl.core.tasks import get_task
from asyncrl.core.tasks.reasoning_gym import extract_answer
from asyncrl.rollout.trajectories import wire_metadata
from tests.unit.test_dataset_task import TOKENIZER

SUMS = {"name": "basic_arithmetic", "config": {"min_terms": 2, "max_terms": 2, "max_digits": 2, "operators": ["+"],
                                               "allow_parentheses": False, "allow_negation": False}}


@pytest.fixture(scope="module")
def tokenizer() -> ModelTokenizer:
    return ModelTokenizer.load(TOKENIZER)


def task_of(tokenizer, **section):
    return get_task(TaskConfig(name="reasoning_gym", reasoning_gym=section), tokenizer)


@pytest.mark.parametrize(("dataset", "key", "words"), [
    ({"name": "basic_arithmetc"}, "datasets[0].name", "did you mean basic_arithmetic"),
    ({"name": "composite"}, "datasets[0].name", "not a reasoning-gym dataset"),
    ({"name": "chain_sum", "config": {"max_digit": 3}}, "datasets[0].config.max_digit", "its options: "),
    ({"name": "chain_sum", "config": {"seed": 3}}, "datasets[0].config.seed", "task.reasoning_gym.seed"),
    ({"name": "basic_arithmetic", "config": {"min_terms": 5, "max_terms": 2}}, "datasets[0].config",
     "max_terms must be >= min_terms"),
    ({"name": "basic_arithmetic", "weight": 0}, "weight", "greater than 0"),
])  # fmt: skip
def test_a_dataset_or_option_that_does_not_exist_is_a_config_error_naming_the_key(dataset, key, words):
    with pytest.raises(ValidationError) as refused:
        TaskConfig(name="reasoning_gym", reasoning_gym={"datasets": [dataset]})
    message = str(refused.value)
    assert key in message and words in message


def test_the_task_needs_a_dataset():
    with pytest.raises(ValidationError, match="task.reasoning_gym.datasets: must name at least one dataset"):
        TaskConfig(name="reasoning_gym")


def test_held_out_questions_are_never_trained_on_and_every_process_agrees(tokenizer):
    task = task_of(tokenizer, datasets=[SUMS], size=3000, eval_size=200, seed=4)
    held_out = {p.metadata["question"] for p in task.eval_prompts()}
    assert len(task.eval_prompts()) == 200
    train = [task.train_prompt(k).metadata["question"] for k in range(task.num_train * 2)]
    assert not held_out & set(train)
    # 2-digit sums repeat across a 3,000-entry pool: the held-out ones were dropped from it.
    assert task.dropped > 0 and task.num_train == 3000 - task.dropped
    again = task_of(tokenizer, datasets=[SUMS], size=3000, eval_size=200, seed=4)
    assert [again.train_prompt(k).metadata for k in (0, 17, 5000)] == [task.train_prompt(k).metadata
                                                                       for k in (0, 17, 5000)]


def test_different_seeds_draw_different_streams(tokenizer):
    # reasoning-gym seeds entry i with seed + i: without spacing, seed 1 would be seed 0 shifted by one entry.
    three_digits = {"name": "basic_arithmetic", "config": {**SUMS["config"], "min_digits": 3, "max_digits": 3}}
    questions = [[p.metadata["question"] for p in task_of(tokenizer, datasets=[three_digits], size=300,
                                                          eval_size=100, seed=seed).eval_prompts()]
                 for seed in (0, 1)]  # fmt: skip
    assert len(set(questions[0]) & set(questions[1])) <= 2  # 810,000 possible sums: a shared one is chance


def test_a_weighted_mixture_draws_each_dataset_by_its_weight(tokenizer):
    chain = {"name": "chain_sum", "weight": 3.0, "config": {"min_terms": 2, "max_terms": 3}}
    task = task_of(tokenizer, datasets=[SUMS, chain], size=2000, eval_size=50)
    counts = collections.Counter(task.train_prompt(k).metadata["metadata"]["source_dataset"] for k in range(2000))
    share = counts["chain_sum"] / sum(counts.values())
    assert 0.70 < share < 0.80  # 3:1, 2,000 draws: the binomial spread is about 0.01


def test_the_prompt_is_the_question_and_instruction_in_the_models_chat_template(tokenizer):
    task = task_of(tokenizer, datasets=[SUMS], size=100, eval_size=10, system_prompt="Be brief.",
                   instruction="Answer in <answer></answer> tags.")
    prompt = task.train_prompt(0)
    question = prompt.metadata["question"]
    assert prompt.text == [{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": f"{question}\n\nAnswer in <answer></answer> tags."}]
    assert tokenizer.hf.decode(prompt.token_ids).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(("response", "tag", "fallback", "answer"), [
    ("so <answer>12</answer> and <answer> 13 </answer>", "answer", "none", "13"),
    ("it is 12, no, 1,300.", "answer", "none", None),
    ("it is 12, no, 1,300.", "answer", "last_number", "1300"),
    ("it is -7/2 then 4", None, "last_number", "4"),
    ("a half: -7/2", None, "last_number", "-7/2"),
    ("first\nsecond line \n\n", "answer", "last_line", "second line"),
    ("  all of it ", "answer", "whole", "all of it"),
    ("no number here", "answer", "last_number", None),
    ("<final>x</final>", "final", "none", "x"),
])  # fmt: skip
def test_answer_extraction(response, tag, fallback, answer):
    assert extract_answer(response, tag, fallback) == answer


def test_the_reward_is_reasoning_gyms_verifier_on_the_extracted_answer(tokenizer):
    task = task_of(tokenizer, datasets=[SUMS], size=100, eval_size=10, fallback="last_number")
    prompt = task.train_prompt(3)
    right, wrong = prompt.metadata["answer"], str(int(prompt.metadata["answer"]) + 1)
    assert task.reward(f"<answer>{right}</answer>", prompt.metadata) == 1.0
    assert task.reward(f"The sum is {right}.", prompt.metadata) == 1.0  # the fallback
    assert task.reward(f"<answer>{wrong}</answer> or {right}", prompt.metadata) == 0.0  # the tag wins
    assert task.reward("I do not know.", prompt.metadata) == 0.0
    # The entry as the proto's string map carries it (JSON values) scores the same.
    assert task.reward(f"<answer>{right}</answer>", wire_metadata(prompt.metadata)) == 1.0


def test_without_a_fallback_an_untagged_answer_scores_nothing(tokenizer):
    task = task_of(tokenizer, datasets=[SUMS], size=100, eval_size=10)
    prompt = task.train_prompt(0)
    assert task.reward(prompt.metadata["answer"], prompt.metadata) == 0.0
    assert task.reward(f"<answer>{prompt.metadata['answer']}</answer>", prompt.metadata) == 1.0
