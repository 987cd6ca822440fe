"""Shared fixtures. `tiny_model_dir`: a tiny policy + teacher checkpoint built once per test session.

Every service requires a token on its gRPC calls: the test session sets one in the environment (what the
services read by default) and `TEST_AUTH` is what in-process test clients send; likewise the learner secret
(`TEST_LEARNER_SECRET`).

The checkpoints have the demo's shapes (Qwen2, head size 64, the arith tokenizer) but only a handful of
warm-start steps, so they build in seconds; tests needing a real checkpoint directory (engines, teacher,
learner, vLLM) point at `tiny_model_dir.policy` / `.teacher` or use `tiny_model_dir.config`.
"""

from __future__ import annotations

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
TEST_STORE_KEY = bytes(range(32))
"""The store key of plans whose store is never reached (`push.store_gate`; a real store makes its own)."""



WHOLE_SYSTEM = ("tests/e2e/", "tests/chaos/")
"""The tiers of whole-system tests (folders relative to the repository root, as node ids name them)."""
BUILDS_FILE = "tests/integration/test_example_models.py"
EXAMPLE_MODELS = ("tiny-arith", "tool-agent", "tiny-moe", "word-problems")
"""The examples whose models BUILDS_FILE builds, in its order: the demo's first, which most runs use."""
SHORT_WARM_STARTS = {
    "word-problems": ("tiny_model.warmstart_steps=100", "tiny_model.teacher_steps=200"),
    "tool-agent": ("tiny_model.warmstart_steps=150", "tiny_model.warmstart_until_accuracy=null"),
}
"""Examples whose runs in the suite check only mechanics (what was trained, resumed, exported, served, how many
turns an episode took), so their model needs the example's shapes, tokenizer, task and reward but not its full
warm start: the word-problems model with 100 + 100 supervised steps instead of 450 + 750, the agent's with 150
steps instead of 200 and then on until 40% of its sums are solved (about 300 in all): at 150 it takes 2.2-2.4
turns an episode at most, which the agent runs assert is above 2 (at 70 steps: 2.03-2.09). They are built
into artifacts/tests/<example>/, so the full model a user's first run builds in the example's own folder is
never replaced by a short one, nor the other way round."""


def example_overrides(example: str) -> list[str]:
    """The `--set` values that point a run of `example` (its name: "word-problems") at the model the suite
    builds for it: none for most examples, a shorter warm start in a folder of its own for SHORT_WARM_STARTS."""
    if example not in SHORT_WARM_STARTS:
        return []
    folder = f"artifacts/tests/{example}"
    return [*SHORT_WARM_STARTS[example], f"model.path={folder}/policy", f"teacher.model_path={folder}/teacher"]


CHAIN_OPENERS = ("tests/e2e/test_vllm_engine.py", "tests/e2e/test_vllm_lora.py", "tests/e2e/test_vllm_runs.py")
"""Whole-system tests that need no example model (they build random tiny checkpoints of their own): they open
the chain while the other worker builds the example models, so no build runs beside a build."""
AFTER_BUILDS = ("tests/e2e/test_own_model.py", "tests/e2e/test_moe_routing_replay.py", "tests/chaos/test_soak.py",
                "tests/chaos/test_paused_replica.py", "tests/chaos/test_fake_replica.py")
"""Whole-system tests that the builds' worker runs right after the builds, beside the chain: the runs on the
last two models built, and the chaos runs whose bounds hold with a whole run beside them (measured: a paused
replica's longest step gap 1.1 s of a bound of 18, the fake replica in 2 pushes of 4, every soak fault
recovered within 1 s of 90). The chain is the critical path; at its end they kept the other worker idle."""


def chain_rank(item) -> int:
    """Where a whole-system test comes in the chain: by the model it runs on, in EXAMPLE_MODELS order (the
    demo's unless it is marked `example_model(name)`), so none waits for a build that a test on an earlier
    model could have run beside."""
    marker = item.get_closest_marker("example_model")
    return EXAMPLE_MODELS.index(marker.args[0]) if marker else 0


def pytest_xdist_make_scheduler(config, log):
    """Under `pytest -n` (scripts/test.sh): the whole-system tests (e2e, chaos) are one work unit, the chain, run
    in order on one worker, AFTER_BUILDS another; every other test file is a unit of its own (its module's
    fixtures built once). Two whole runs side by side took longer than one after the other: each keeps both
    cores busy (load 7 on two cores); AFTER_BUILDS evens the two workers out, as the chain is the critical
    path."""
    from xdist.scheduler import LoadScopeScheduling

    class WholeSystemOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(AFTER_BUILDS):
                return "whole-system-after-builds"
            return "whole-system" if nodeid.startswith(WHOLE_SYSTEM) else nodeid.split("::", 1)[0]

    return WholeSystemOnOneWorker(config, log)


def pytest_collection_modifyitems(config, items):
    """The whole-system unit is the suite's long pole: it goes first, to one worker from the start, opened by
    the tests that need no example model, then the others (`chain_rank`); the example models' builds go to the
    other worker, then AFTER_BUILDS, then the unit and integration tests (scripts/test.sh passes
    `--no-loadscope-reorder`, which keeps this order). Two builds side by side (torch's threads on two cores)
    took 3.5 times as long as one."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Matched most specific first (AFTER_BUILDS and CHAIN_OPENERS lie inside WHOLE_SYSTEM), ranked by run order.
        ranks = {AFTER_BUILDS: 3, CHAIN_OPENERS: 0, WHOLE_SYSTEM: 1, (BUILDS_FILE,): 2}

        def rank(item) -> tuple[int, int]:
            first = next((at for prefixes, at in ranks.items() if item.nodeid.startswith(prefixes)), len(ranks))
            return first, chain_rank(item) if first == ranks[WHOLE_SYSTEM] else 0

        items.sort(key=rank)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test marked `alone` (it asserts a timing the other worker would move) runs with nothing beside it under
    `pytest -n`, its fixtures' set-up and tear-down included: a lock of this test run's, exclusive for it and
    shared for the others."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        return (yield)
    alone = item.get_closest_marker("alone") is not None
    with open(Path(tempfile.gettempdir()) / f"asyncrl-tests-{run}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
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

