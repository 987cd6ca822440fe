"""The rollout's reward pool: failures score 0, are counted, and are logged once per distinct error."""

from __future__ import annotations

import logging
import time

from asyncrl.rollout.reward_pool import RewardPool


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
    with caplog.at_level(logging.ERROR, logger="asyncrl.rollout.reward_pool"):
        scores = pool.score([("ab", {}), ("boom", {}), ("boom", {}), ("nan", {}), ("slow", {}), ("abc", {})])
    pool.close()
    assert scores == [2.0, 0.0, 0.0, 0.0, 0.0, 3.0]
    assert pool.errors == 4 and sorted(kinds) == ["ValueError", "ZeroDivisionError", "ZeroDivisionError", "timeout"]
    logged = [r.getMessage() for r in caplog.records]
    assert sum("ZeroDivisionError: division by zero" in m for m in logged) == 1  # once per distinct error
    assert any("Traceback" in m for m in logged)
