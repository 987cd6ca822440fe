"""The rollout's reward pool: failures score 0, are counted, and are logged once per distinct error."""

from __future__ import annotations

import logging
import time

from asyncrl.core.tasks.reward_pool import RewardPool


def test_failures_score_zero_counted_and_logged_once(caplog):
    kinds = []

    def reward(response, metadata):
        if response == "boom":
            raise ZeroDivisionError("division by zero")
        if response == "nan":
            return float("nan")
        if response == "slow":
            time.sleep(1.0)
        return float(len(response))

    pool = RewardPool(reward, workers=4, timeout_s=0.3, on_error=kinds.append)
    with caplog.at_level(logging.ERROR, logger="asyncrl.core.tasks.reward_pool"):
        scores = pool.score([("ab", {}), ("boom", {}), ("boom", {}), ("nan", {}), ("slow", {}), ("abc", {})])
    pool.close()
    assert scores == [2.0, 0.0, 0.0, 0.0, 0.0, 3.0]
    assert pool.errors == 4 and sorted(kinds) == ["ValueError", "ZeroDivisionError", "ZeroDivisionError", "timeout"]
    logged = [r.getMessage() for r in caplog.records]
    assert sum("ZeroDivisionError: division by zero" in m for m in logged) == 1  # once per distinct error
    assert any("Traceback" in m for m in logged)


def test_once_every_worker_is_held_by_a_call_that_never_returns_the_pool_says_so():
    # A reward that hangs forever on some responses (a regex backtracking, a solver in a loop) keeps its
    # thread. With workers left, the others are still scored; with none left, the pool raises instead of
    # scoring every later sample 0 after a time-out each.
    import threading

    import pytest

    from asyncrl.core.tasks.reward_pool import RewardWorkersHung

    release = threading.Event()

    def reward(response, metadata):
        if response == "hang":
            release.wait()
        return 1.0

    pool = RewardPool(reward, workers=2, timeout_s=0.2)
    try:
        assert pool.score([("hang", {}), ("ok", {})]) == [0.0, 1.0]  # one worker held, one left
        assert pool.score([("ok", {})]) == [1.0]
        t0 = time.monotonic()
        with pytest.raises(RewardWorkersHung, match=r"all 2 reward workers .* reward.timeout_s \(0.2 s\)"):
            pool.score([("hang", {}), ("ok", {}), ("ok", {}), ("ok", {})])
        assert time.monotonic() - t0 < 1.0  # not one more time-out per queued sample
        with pytest.raises(RewardWorkersHung):
            pool.score([("ok", {})])
        release.set()  # the calls return at last: the workers are free again
        time.sleep(0.1)
        assert pool.score([("ok", {})]) == [1.0]
    finally:
        release.set()
        pool.close()


def test_calls_that_are_slow_but_return_are_not_taken_for_hung():
    # Past its time-out (scored 0), but back within one more: the pool goes on.
    pool = RewardPool(lambda response, metadata: time.sleep(0.3) or 1.0, workers=1, timeout_s=0.2)
    try:
        assert pool.score([("a", {}), ("b", {})]) == [0.0, 0.0]
        assert pool.errors == 2 and pool.score([]) == []
    finally:
        pool.close()
