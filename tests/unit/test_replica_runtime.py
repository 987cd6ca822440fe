"""The replica runtime's rollout thread: a loop that dies of an unexpected error ends the process (exit 1), so
its supervisor starts the replica again; a loop that returns (the replica is stopping) ends nothing."""

from __future__ import annotations

import threading

import pytest

from asyncrl.rollout import runtime
from asyncrl.rollout.runtime import ReplicaRuntime


class Exited(Exception):
    pass


class Worker:
    def __init__(self, error: Exception | None):
        self.error = error

    def run(self, stop: threading.Event) -> None:
        if self.error is not None:
            raise self.error


@pytest.fixture
def replica(monkeypatch):
    def exit_(code):
        raise Exited(code)

    monkeypatch.setattr(runtime.os, "_exit", exit_)
    replica = ReplicaRuntime.__new__(ReplicaRuntime)  # no engine: only the thread body is under test
    replica._stop = threading.Event()
    return replica


def test_a_loop_that_dies_ends_the_process_with_1(replica, caplog):
    with pytest.raises(Exited) as exited:
        replica._roll_out(Worker(AttributeError("a bug")))
    assert exited.value.args == (1,)
    assert "the rollout loop died" in caplog.text and "a bug" in caplog.text


def test_a_loop_that_returns_ends_nothing(replica):
    replica._roll_out(Worker(None))
