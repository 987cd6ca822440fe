"""The replica runtime's threads: a loop that dies of an unexpected error ends the process (exit 1), so its
supervisor starts the replica again; a loop that returns (the replica is stopping) ends nothing. The
heartbeats end the process too when a lease has been held past `rollout.lease_deadline_s` (a stuck loop whose
heartbeats would keep that lease, and the run's quota, alive forever)."""

from __future__ import annotations

import socket
import threading

import pytest

from asyncrl.core.config.rollout import RolloutConfig
from asyncrl.core.wire.routes import route_address
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
    replica._on_failure = None
    return replica


def test_a_loop_that_dies_ends_the_process_with_1(replica, caplog):
    with pytest.raises(Exited) as exited:
        replica._exit_on_failure(Worker(AttributeError("a bug")).run, "rollout loop")
    assert exited.value.args == (1,)
    assert "the rollout loop died" in caplog.text and "a bug" in caplog.text


def test_a_loop_of_one_run_among_several_that_dies_is_reported_not_the_process_ended(replica, caplog):
    """A replica of one run in a deployment of several: its failure goes to whoever restarts it, the process
    (every other run's replica) lives on."""
    failures = []
    replica._on_failure = failures.append
    replica._exit_on_failure(Worker(AttributeError("a bug")).run, "rollout loop")
    assert failures == ["rollout loop died: AttributeError: a bug"]


def test_a_loop_that_returns_ends_nothing(replica):
    replica._exit_on_failure(Worker(None).run, "rollout loop")


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_lease_held_past_the_deadline_ends_the_process_from_the_heartbeat_thread(replica, caplog):
    from asyncrl.rollout.replica import HeldLeases, ReplicaSession

    clock = Clock()
    held = HeldLeases(clock)
    session = ReplicaSession(None, "127.0.0.1:1", None, "torch", "r-1", held=held, lease_deadline_s=60.0)
    held.add("lease-a")
    clock.now += 30.0
    held.add("lease-b")
    held.add("lease-a")  # taken again: still held since the first time
    clock.now += 30.0
    session.check_not_stuck()  # exactly at the deadline: not yet
    assert held.oldest_age_s() == 60.0
    held.discard("lease-a")  # completed: the next oldest counts (held 30 s so far)
    clock.now += 30.0
    session.check_not_stuck()
    clock.now += 1.0
    session.heartbeat_interval_s = 0.001
    with pytest.raises(Exited) as exited:
        replica._exit_on_failure(session.heartbeat_forever, "heartbeats")
    assert exited.value.args == (1,)
    assert "the heartbeats died" in caplog.text and "past rollout.lease_deadline_s (60 s)" in caplog.text
    session.lease_deadline_s = 0  # 0 = never
    session.check_not_stuck()


@pytest.mark.parametrize(("host", "advertise", "controller", "expected"), [
    ("10.1.2.3", "", "127.0.0.1", "10.1.2.3"),             # bound to one address: that one
    ("0.0.0.0", "replica-7", "127.0.0.1", "replica-7"),     # told what to register: that
    ("0.0.0.0", "", "127.0.0.1", "127.0.0.1"),              # every interface: the one toward the controller
], ids=["bound", "told", "routed"])
def test_the_registered_host(host, advertise, controller, expected):
    cfg = RolloutConfig(host=host, advertise_host=advertise or None)
    assert runtime.advertised_host(cfg, controller) == expected


def test_no_route_to_the_controller_falls_back_to_the_host_name(monkeypatch):
    monkeypatch.setattr(socket, "gethostbyname", lambda name: "192.0.2.9")
    assert route_address("no-such-host.invalid") is None
    assert runtime.advertised_host(RolloutConfig(host="0.0.0.0"), "no-such-host.invalid") == "192.0.2.9"
