"""A call that waits on another service says so (`asyncrl.core.wire.slow_calls`): once when it has waited
`after_s`, once when it ends; a quick one says nothing."""

from __future__ import annotations

import logging
import time

from asyncrl.core.wire.slow_calls import said_if_slow

log = logging.getLogger("test_slow_calls")


def test_a_slow_call_says_it_waits_and_when_it_ended(caplog):
    with caplog.at_level(logging.WARNING, logger="test_slow_calls"), \
            said_if_slow("the controller's CommitWeightPush", after_s=0.05, logger=log):
        time.sleep(0.15)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "the controller's CommitWeightPush: no answer for 0.05 s, still waiting"
    assert lines[1].startswith("the controller's CommitWeightPush: ended after 0.")
    assert len(lines) == 2


def test_a_quick_call_says_nothing_even_when_it_fails(caplog):
    with caplog.at_level(logging.WARNING, logger="test_slow_calls"):
        try:
            with said_if_slow("a call", after_s=0.1, logger=log):
                raise ValueError("refused")
        except ValueError:
            pass
        time.sleep(0.2)  # the timer was cancelled: nothing fires late
    assert caplog.records == []
