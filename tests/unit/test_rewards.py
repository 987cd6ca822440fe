"""Built-in rewards, user functions and the reward config's checks (hand-checked cases)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from asyncrl.core.config.data import RewardConfig
from asyncrl.core.tasks.rewards import (
    build_reward,
    exact_match,
    math_equivalence,
    normalize_answer,
    resolve_function,
)


def test_normalize_answer_folds_case_space_and_surrounding_punctuation():
    assert normalize_answer("  The   Answer is 42. ") == "the answer is 42"
    assert normalize_answer('"Paris"!') == "paris"
    assert normalize_answer("a\tb\nc") == "a b c"


def test_exact_match_after_normalisation():
    reward = exact_match("answer")
    assert reward(" 42. ", {"answer": "42"}) == 1.0
    assert reward("PARIS", {"answer": "paris"}) == 1.0
    assert reward("421", {"answer": "42"}) == 0.0
    with pytest.raises(KeyError, match="'answer'"):
        reward("42", {"solution": "42"})


def test_math_verify_equivalence():
    reward = math_equivalence("answer")
    assert reward("The result is $\\frac{1}{2}$", {"answer": "0.5"}) == 1.0
    assert reward("\\boxed{4}", {"answer": "4"}) == 1.0
    assert reward("5", {"answer": "4"}) == 0.0
    assert reward("no number here", {"answer": "4"}) == 0.0


def test_regex_and_weighted():
    fmt = build_reward(RewardConfig(type="regex", pattern=r"^\d+$"))
    assert fmt("12", {}) == 1.0 and fmt("12 apples", {}) == 0.0
    combined = build_reward(RewardConfig.model_validate({
        "type": "weighted",
        "components": [
            {"weight": 0.9, "reward": {"type": "exact_match"}},
            {"weight": 0.1, "reward": {"type": "regex", "pattern": r"^\d+$"}},
        ],
    }))  # fmt: skip
    assert combined("7", {"answer": "7"}) == pytest.approx(1.0)
    assert combined("7 apples", {"answer": "7"}) == pytest.approx(0.0)
    assert combined("8", {"answer": "7"}) == pytest.approx(0.1)


def test_task_reward_is_the_tasks_own():
    own = lambda response, metadata: 0.25
    assert build_reward(RewardConfig(), own) is own
    with pytest.raises(ValueError, match="no reward of its own"):
        build_reward(RewardConfig(), None)


def test_user_function_from_a_file_and_a_module(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text("def score(response, metadata):\n    return float(response == metadata['answer'])\n")
    fn = resolve_function(f"{path}:score")
    assert fn("3", {"answer": "3"}) == 1.0 and fn("4", {"answer": "3"}) == 0.0
    from asyncrl.core.tasks.arith import arith_exact

    assert resolve_function("asyncrl.core.tasks.arith:arith_exact") is arith_exact


@pytest.mark.parametrize(
    ("source", "spec_suffix", "message"),
    [
        ("def score(response, metadata:\n    return 1\n", ":score", "syntax error in .* line 1"),
        ("def score(response):\n    return 1\n", ":score", r"cannot be called as score\(response_text, metadata\)"),
        ("def other(response, metadata):\n    return 1\n", ":score", "has no function 'score'"),
        ("raise RuntimeError('boom at import')\n", ":score", "importing .* failed: RuntimeError: boom at import"),
    ],
)
def test_broken_user_rewards_fail_at_load_naming_the_file(tmp_path, source, spec_suffix, message):
    path = tmp_path / "bad_reward.py"
    path.write_text(source)
    with pytest.raises(ValidationError, match=f"reward.function: .*{message}"):
        RewardConfig(type="function", function=f"{path}{spec_suffix}")


def test_reward_config_errors_name_the_key(tmp_path):
    with pytest.raises(ValidationError, match="reward.function: .*does not exist"):
        RewardConfig(type="function", function=f"{tmp_path}/missing.py:score")
    with pytest.raises(ValidationError, match="cannot import module 'no_such_module_xyz'"):
        RewardConfig(type="function", function="no_such_module_xyz:score")
    with pytest.raises(ValidationError, match="reward.pattern: required"):
        RewardConfig(type="regex")
    with pytest.raises(ValidationError, match="reward.pattern: not a regular expression"):
        RewardConfig(type="regex", pattern="(")
    with pytest.raises(ValidationError, match="reward.components: a weighted reward needs"):
        RewardConfig(type="weighted")
    with pytest.raises(ValidationError, match="type"):
        RewardConfig(type="exact")  # an unknown built-in
