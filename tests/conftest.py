"""Shared fixtures. `tiny_model_dir`: a tiny policy + teacher checkpoint built once per test session.

Every service requires a token on its gRPC calls: the test session sets one in the environment (what the
services read by default) and `TEST_AUTH` is what in-process test clients send; likewise the learner secret
(`TEST_LEARNER_SECRET`).

The checkpoints have the demo's shapes (Qwen2, head size 64, the arith tokenizer) but only a handful of
warm-start steps, so they build in seconds; tests needing a real checkpoint directory (engines, teacher,
learner, vLLM) point at `tiny_model_dir.policy` / `.teacher` or use `tiny_model_dir.config`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from asyncrl.core.wire.auth import Auth, new_token

# Several processes share very few cores; one intra-op thread keeps the tests from oversubscribing them.
torch.set_num_threads(1)

os.environ["ASYNCRL_TOKEN"] = os.environ.get("ASYNCRL_TOKEN") or new_token()
TEST_AUTH = Auth(os.environ["ASYNCRL_TOKEN"])
# The learner's own secret (`asyncrl.core.wire.learner_secret`): controllers built in tests seat only a learner that
# proves it; test clients that play the learner pass it to `SeatedController`.
os.environ["ASYNCRL_LEARNER_SECRET"] = os.environ.get("ASYNCRL_LEARNER_SECRET") or new_token()
TEST_LEARNER_SECRET = os.environ["ASYNCRL_LEARNER_SECRET"].encode()



@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under `pytest -n` (scripts/test.sh runs two workers): whole-system tests (e2e, chaos) run one at a time,
    a unit or integration test beside them; a test marked `alone` runs with nothing beside it. Fixtures'
    set-up and tear-down count as the test's. Two whole runs side by side took longer than one after the
    other (each keeps both cores busy: load 7 on two cores); a timing a test asserts would move. File locks
    of this test run's, always taken in the same order (system, then alone)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        return (yield)
    whole = any(item.get_closest_marker(name) for name in ("e2e", "chaos"))
    alone = item.get_closest_marker("alone") is not None
    with contextlib.ExitStack() as locks:
        for name, exclusive, needed in (("system", True, whole), ("alone", alone, True)):
            if needed:
                lock = locks.enter_context(open(Path(tempfile.gettempdir()) / f"asyncrl-tests-{run}.{name}", "a"))
                fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        return (yield)


TEST_WARMSTART_STEPS = 6
TEST_TEACHER_STEPS = 12


@dataclass(frozen=True)
class TinyModelDir:
    policy: Path
    """Warm-started policy checkpoint (with tokenizer)."""
    teacher: Path
    """Teacher checkpoint (same shapes and tokenizer, a few more steps)."""
    config: object
    """The `AsyncRLConfig` used to build them (model.path / teacher.model_path point at the dirs above)."""


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> TinyModelDir:
    from asyncrl.core.config.schema import AsyncRLConfig
    from asyncrl.tools.tiny_model import make_tiny_model

    root = tmp_path_factory.mktemp("tiny-model")
    config = AsyncRLConfig.model_validate(
        {
            "model": {"path": str(root / "policy")},
            "teacher": {"enabled": True, "model_path": str(root / "teacher")},
            "tiny_model": {"warmstart_steps": TEST_WARMSTART_STEPS, "teacher_steps": TEST_TEACHER_STEPS},
            # In-process servers without a Redis; the Redis store has tests of its own.
            "controller": {"state_store": "none"},
        }
    )
    paths = make_tiny_model(config)
    return TinyModelDir(policy=paths.policy, teacher=paths.teacher, config=config)
