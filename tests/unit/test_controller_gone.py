"""A silent lease holder whose process is gone (`controller.dial_silent_after_s`, `Liveness.check_gone`): the
controller dials its address, and a refused connection declares it dead at once, returning its leases'
quota, long before its heartbeat time-out. A dial that connects (a paused or busy process), a replica that
heartbeats again, one that never answered at its address, or one holding no lease is left alone."""

from __future__ import annotations

import time

from asyncrl.controller.state import ControllerState
from asyncrl.core.config.schema import ControllerConfig
from asyncrl.core.wire.auth import liveness_mac
from tests.fakes import FakeClock, FakeNotifier, MemoryEvents


class Dialer:
    """The `gone` probe: which addresses refuse a connection, and every address dialled."""

    def __init__(self):
        self.refusing: set[str] = set()
        self.dialled: list[str] = []

    def __call__(self, address: str) -> bool:
        self.dialled.append(address)
        return address in self.refusing


class Queued:
    """Stands in for `ReachabilityChecks`: keeps what the state queued, the test runs it."""

    def __init__(self):
        self.due: list[tuple[str, bytes]] = []

    def submit(self, replica_id: str, key: bytes, delay_s: float) -> None:
        self.due.append((replica_id, key))

    def close(self) -> None:
        pass


def fleet(**fields):
    """A controller at η = 0 and B = 8 with two reachable replicas; r-a holds the batch's only lease."""
    clock, events, dialer = FakeClock(), MemoryEvents(), Dialer()
    config = ControllerConfig(eta=0, heartbeat_interval_s=1.0, heartbeat_timeout_s=10.0, trust_initial_weights=True,
                              **fields)
    state = ControllerState(config, 8, events=events, notify=FakeNotifier(), clock=clock, gone=dialer,
                            probe=lambda address, challenge: liveness_mac(keys[address], challenge))
    state.reachability.close()
    state.liveness.queue_dials_on(queued := Queued())
    keys = {}
    for rid, address in (("r-a", "127.0.0.1:7001"), ("r-b", "127.0.0.1:7002")):
        keys[address] = state.register(address, rid, 0, "torch").push_key
        assert state.reachability.check_reachable(rid, keys[address]) is None
    assert state.admission.try_acquire("r-a", 8, time.monotonic(), final=True).granted
    assert not state.admission.try_acquire("r-b", 8, time.monotonic(), final=True).granted  # the quota is r-a's
    return state, clock, events, dialer, queued


def run_due(state, queued):
    due, queued.due = queued.due, []
    for replica_id, key in due:
        state.liveness.check_gone(replica_id, key)
    return [replica_id for replica_id, _ in due]


def test_a_silent_lease_holder_whose_address_refuses_is_dead_at_once_and_its_quota_returns():
    state, clock, events, dialer, queued = fleet()
    dialer.refusing.add("127.0.0.1:7001")  # r-a's process is killed
    clock.advance(1.0)
    state.heartbeat("r-b", 0)
    state.liveness.reap()
    assert run_due(state, queued) == []  # silent for 1 s: not yet
    clock.advance(0.6)
    state.heartbeat("r-b", 0)
    state.liveness.reap()
    assert run_due(state, queued) == ["r-a"]  # only the lease holder, only the silent one
    assert dialer.dialled == ["127.0.0.1:7001"]
    dead = events.of_kind("replica_dead")
    assert [(e["replica_id"], e["reason"], e["leases_expired"]) for e in dead] == [("r-a", "gone", 1)]
    assert [e["reason"] for e in events.of_kind("lease_expired")] == ["gone"]
    view = next(r for r in state.snapshot()["replicas"] if r["replica_id"] == "r-a")
    assert view["dead_reason"] == "its process is gone: the controller's dial of 127.0.0.1:7001 was refused"
    assert state.admission.try_acquire("r-b", 8, time.monotonic(), final=True).granted  # 1.6 s after, not 10 s


def test_a_silent_holder_that_still_accepts_connections_is_left_alone_and_dialled_again_later():
    state, clock, events, dialer, queued = fleet()
    clock.advance(1.6)  # r-a paused: silent, but its port still accepts connections
    state.liveness.reap()
    assert run_due(state, queued) == ["r-a"] and not events.of_kind("replica_dead")
    clock.advance(1.0)
    state.liveness.reap()
    assert run_due(state, queued) == []  # at most once per dial_silent_after_s
    clock.advance(0.5)
    state.liveness.reap()
    assert run_due(state, queued) == ["r-a"] and len(dialer.dialled) == 2
    assert state.snapshot()["replicas"][0]["alive"]


def test_a_heartbeat_between_the_queueing_and_the_dial_wins():
    state, clock, events, dialer, queued = fleet()
    dialer.refusing.add("127.0.0.1:7001")
    clock.advance(2.0)
    state.liveness.reap()
    state.heartbeat("r-a", 0)  # it spoke after all (its address refuses: a wrong advertised host, say)
    assert run_due(state, queued) == ["r-a"]
    assert dialer.dialled == [] and not events.of_kind("replica_dead")


def test_no_dial_for_a_replica_without_leases_one_never_reached_or_with_dialling_off():
    state, clock, _, _, queued = fleet()
    clock.advance(5.0)
    state.heartbeat("r-a", 0)
    state.liveness.reap()  # r-b is silent but holds no lease: a push finds out about it if need be
    assert run_due(state, queued) == []
    state, clock, _, _, queued = fleet(dial_silent_after_s=0)
    clock.advance(5.0)
    state.liveness.reap()
    assert run_due(state, queued) == []
    state, clock, _, dialer, queued = fleet()
    state.books.registry.get("r-a").reachable = False  # its address never answered: a refusal there says nothing
    clock.advance(5.0)
    state.liveness.reap()
    assert run_due(state, queued) == [] and dialer.dialled == []
