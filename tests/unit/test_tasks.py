"""The arith task: deterministic prompt stream, disjoint held-out set, exact reward, greedy accuracy."""

import threading
import time
from types import SimpleNamespace

import pytest

from asyncrl.core.config.schema import TaskConfig
from asyncrl.core.engines.base import Generation
from asyncrl.core.tasks import Prompt, get_reward, get_task
from asyncrl.core.tasks.arith import arith_exact
from asyncrl.core.tasks.evaluate import greedy_accuracy, greedy_rewards
from asyncrl.core.tasks.reward_pool import RewardPool, RewardWorkersHung


def test_prompt_format_and_answer():
    task = get_task(TaskConfig(num_digits=2, eval_size=50, seed=0))
    for index in range(50):
        p = task.train_prompt(index)
        a, b = p.text[:-1].split("+")
        assert p.text.endswith("=") and 0 <= int(a) < 100 and 0 <= int(b) < 100
        assert p.metadata["answer"] == str(int(a) + int(b))
        assert p.token_ids[0] == task.tokenizer.hf.bos_token_id
        assert task.tokenizer.hf.decode(p.token_ids, skip_special_tokens=True) == p.text


def test_hand_checked_encoding():
    task = get_task(TaskConfig())
    # <bos>=1, digits 0..9 = 4..13, '+'=14, '='=15 (the vocabulary order of asyncrl.core.model.tokenizer).
    assert task.tokenizer.encode_prompt("12+34=") == [1, 5, 6, 14, 7, 8, 15]


def test_stream_is_deterministic_and_seeded():
    cfg = TaskConfig(num_digits=3, eval_size=20, seed=7)
    a, b = get_task(cfg), get_task(cfg)
    assert [a.train_prompt(i) for i in range(30)] == [b.train_prompt(i) for i in range(30)]
    assert a.eval_prompts() == b.eval_prompts()
    # Random access gives the same prompt as sequential access.
    assert a.train_prompt(1234) == b.train_prompt(1234)
    other = get_task(TaskConfig(num_digits=3, eval_size=20, seed=8))
    assert [p.text for p in other.eval_prompts()] != [p.text for p in a.eval_prompts()]


def test_eval_set_is_distinct_and_disjoint_from_training():
    # 1-digit addition has only 100 operand pairs, so a long training stream visits every one it can.
    task = get_task(TaskConfig(num_digits=1, eval_size=30, seed=3))
    eval_texts = [p.text for p in task.eval_prompts()]
    assert len(eval_texts) == 30 and len(set(eval_texts)) == 30
    train_texts = {task.train_prompt(i).text for i in range(3000)}
    assert train_texts.isdisjoint(eval_texts)
    assert len(train_texts) == 70  # every other pair does show up


def test_eval_size_too_large_is_rejected():
    with pytest.raises(ValueError, match="eval_size"):
        get_task(TaskConfig(num_digits=1, eval_size=51))


def test_negative_index_is_rejected():
    with pytest.raises(ValueError, match="index"):
        get_task(TaskConfig()).train_prompt(-1)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("46", 1.0),
        (" 46\n", 1.0),
        ("46<eos>", 1.0),
        ("046", 0.0),
        ("4 6", 0.0),
        ("466", 0.0),
        ("4", 0.0),
        ("", 0.0),
        ("46+", 0.0),
        ("<bos>46", 0.0),
        (None, 0.0),
        (b"46", 0.0),
        (46, 0.0),
    ],
)
def test_arith_exact(text, expected):
    assert arith_exact(text, {"answer": "46"}) == expected


def test_arith_exact_with_broken_metadata():
    assert arith_exact("46", {}) == 0.0
    assert arith_exact("46", {"answer": ""}) == 0.0
    assert arith_exact("46", None) == 0.0


def test_reward_registry():
    assert get_reward("arith_exact") is arith_exact
    with pytest.raises(ValueError, match="unknown reward 'nope'"):
        get_reward("nope")
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        get_task(SimpleNamespace(name="nope"))


def test_decode_response_stops_at_eos_and_keeps_junk_visible():
    task = get_task(TaskConfig())
    tok = task.tokenizer
    four, six = tok.encode_text("4")[0], tok.encode_text("6")[0]
    eos, bos = tok.eos_ids[0], tok.hf.bos_token_id
    assert task.decode_response([four, six, eos, four]) == "46"
    assert task.decode_response([four, six]) == "46"
    assert task.decode_response([four, bos, six, eos]) == "4<bos>6"
    assert task.reward(task.decode_response([four, bos, six]), {"answer": "46"}) == 0.0


def _fake_generator(task, correct: set[str]):
    """Answers the prompts whose text is in `correct` right and every other one wrong."""
    by_ids = {tuple(p.token_ids): p for p in task.eval_prompts()}

    def generate(prompts, params, n):
        assert params.greedy and n == 1
        out = []
        for ids in prompts:
            p = by_ids[tuple(ids)]
            answer = p.metadata["answer"] if p.text in correct else p.metadata["answer"] + "1"
            tokens = task.tokenizer.encode_text(answer) + [task.tokenizer.eos_ids[0]]
            out.append([Generation(tokens, [0.0] * len(tokens), [0] * len(tokens), True)])
        return out

    return generate


def test_greedy_accuracy_with_a_fake_generator():
    task = get_task(TaskConfig(eval_size=40))
    prompts = task.eval_prompts()
    correct = {p.text for p in prompts[:10]}
    assert greedy_accuracy(_fake_generator(task, correct), task) == pytest.approx(0.25)
    assert greedy_rewards(_fake_generator(task, correct), task, prompts[:2]) == [1.0, 1.0]
    engine_like = SimpleNamespace(generate=_fake_generator(task, set()))
    assert greedy_accuracy(engine_like, task) == 0.0
    with pytest.raises(ValueError, match="Engine or a generate callable"):
        greedy_accuracy(object(), task)


def test_a_held_out_reward_past_its_time_out_scores_0_and_one_that_hangs_for_good_ends_the_evaluation():
    """The learner scores held-out responses through a `RewardPool`, as a replica scores its samples: a slow
    reward scores 0 after `reward.timeout_s`, and once every worker is held by one that never returns the
    evaluation fails instead of holding its run forever."""
    task = get_task(TaskConfig(eval_size=40))
    prompts = task.eval_prompts()[:6]
    correct = {p.text for p in prompts}
    release = threading.Event()
    hangs = {prompts[1].metadata["answer"], prompts[4].metadata["answer"]}

    def reward(text, metadata):
        if metadata["answer"] in hangs:
            release.wait()
        return task.reward(text, metadata)

    pool = RewardPool(reward, workers=3, timeout_s=0.2)
    try:
        started = time.monotonic()
        rewards = greedy_rewards(_fake_generator(task, correct), task, prompts, score=pool.score)
        assert rewards == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0] and pool.errors == 2
        assert time.monotonic() - started < 2.0
        with pytest.raises(RewardWorkersHung, match="reward.timeout_s"):
            greedy_accuracy(_fake_generator(task, correct), task, prompts, score=pool.score)
    finally:
        release.set()
        pool.close()


def test_prompt_is_a_value():
    p = Prompt("1+2=", [1, 5, 14, 6, 15], {"answer": "3"})
    assert p == Prompt("1+2=", [1, 5, 14, 6, 15], {"answer": "3"})
