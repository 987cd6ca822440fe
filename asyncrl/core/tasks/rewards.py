"""Rewards: the built-ins users expect, user functions named in the config, and a weighted combination.

A reward is `fn(response_text, metadata) -> float`, where `metadata` holds the prompt's other dataset fields
(e.g. the reference answer). `RewardConfig` (the `reward` section) names one; `build_reward` turns it into
the function. User functions are resolved and their signature checked when the config loads
(`resolve_function`), so a typo, a syntax error or a wrong signature fails at start with the file named,
never in a crash loop of the replicas.

Built-ins:
- `exact_match`: the response equals `metadata[answer_field]` after normalisation (case, surrounding
  whitespace and punctuation, runs of spaces, a trailing period);
- `math_verify`: mathematical equivalence of the response's final answer and the reference, with the
  `math-verify` package (LaTeX, fractions, sets, ...);
- `regex`: 1.0 when `pattern` matches the response (a format check);
- `weighted`: the weighted sum of component rewards.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

RewardFn = Callable[[str, dict[str, Any]], float]


def normalize_answer(text: str) -> str:
    """Lower case, surrounding whitespace/quotes/punctuation removed, inner whitespace runs folded."""
    text = " ".join(str(text).split()).lower()
    return text.strip(" \t\n\"'`.,;:!?")


def exact_match(answer_field: str) -> RewardFn:
    def reward(response: str, metadata: dict[str, Any]) -> float:
        if answer_field not in metadata:
            raise KeyError(f"metadata has no {answer_field!r} field (reward.answer_field)")
        return float(normalize_answer(response) == normalize_answer(metadata[answer_field]))

    return reward


def math_equivalence(answer_field: str) -> RewardFn:
    """math-verify's parse + verify; its signal-based time-outs are off (rewards run in worker threads, where
    signals cannot reach; the rollout's reward pool bounds the time instead)."""
    from math_verify import parse, verify

    def reward(response: str, metadata: dict[str, Any]) -> float:
        if answer_field not in metadata:
            raise KeyError(f"metadata has no {answer_field!r} field (reward.answer_field)")
        gold = parse(str(metadata[answer_field]), parsing_timeout=None)
        answer = parse(response, parsing_timeout=None)
        return float(bool(gold) and bool(answer) and verify(gold, answer, timeout_seconds=None))

    return reward


def regex_match(pattern: str) -> RewardFn:
    compiled = re.compile(pattern, re.DOTALL)

    def reward(response: str, metadata: dict[str, Any]) -> float:
        return float(compiled.search(response) is not None)

    return reward


def weighted(parts: list[tuple[float, RewardFn]]) -> RewardFn:
    def reward(response: str, metadata: dict[str, Any]) -> float:
        return sum(weight * float(fn(response, metadata)) for weight, fn in parts)

    return reward


def load_function(spec: str, kind: str = "reward") -> Callable:
    """`package.module:function` or `path/to/file.py:function` -> the callable (a reward, a tool). Raises
    ValueError naming what is wrong; `kind` names what the function is for in the message."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise ValueError(f"{spec!r}: expected 'package.module:function' or 'path/to/file.py:function'")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise ValueError(f"{spec!r}: {kind} file {target!r} does not exist")
        module_name = f"asyncrl_user_{kind}_{abs(hash(str(path.resolve())))}"
        module = sys.modules.get(module_name)
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(loader_spec)
            try:
                loader_spec.loader.exec_module(module)
            except SyntaxError as err:
                raise ValueError(f"{spec!r}: syntax error in {target} line {err.lineno}: {err.msg}") from None
            except Exception as err:  # noqa: BLE001 - any import-time failure of user code, reported by name
                raise ValueError(f"{spec!r}: importing {target} failed: {type(err).__name__}: {err}") from None
            sys.modules[module_name] = module
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as err:
            raise ValueError(f"{spec!r}: cannot import module {target!r}: {err}") from None
        except SyntaxError as err:
            raise ValueError(f"{spec!r}: syntax error in {err.filename} line {err.lineno}: {err.msg}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{spec!r}: {target} has no function {name!r}")  # noqa: TRY004 - a config error
    return fn


def resolve_function(spec: str) -> RewardFn:
    """`package.module:function` or `path/to/file.py:function` -> the function, checked to accept
    (response_text, metadata). Raises ValueError naming what is wrong."""
    fn = load_function(spec)
    name = spec.rpartition(":")[2]
    try:
        inspect.signature(fn).bind("response", {})
    except TypeError:
        raise ValueError(
            f"{spec!r}: {name}{inspect.signature(fn)} cannot be called as {name}(response_text, metadata)"
        ) from None
    return fn


def build_reward(cfg, task_reward: RewardFn | None = None) -> RewardFn:
    """The function a `RewardConfig` names; type "task" is the task's own (`task_reward`)."""
    if cfg.type == "task":
        if task_reward is None:
            raise ValueError("reward.type is 'task' but the task has no reward of its own")
        return task_reward
    if cfg.type == "exact_match":
        return exact_match(cfg.answer_field)
    if cfg.type == "math_verify":
        return math_equivalence(cfg.answer_field)
    if cfg.type == "regex":
        return regex_match(cfg.pattern)
    if cfg.type == "function":
        return resolve_function(cfg.function)
    if cfg.type == "weighted":
        return weighted([(part.weight, build_reward(part.reward, task_reward)) for part in cfg.components])
    raise ValueError(f"reward.type: unknown {cfg.type!r}")
