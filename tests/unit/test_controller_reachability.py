"""Reachability of new registrations (`controller/reachability.py`): a replica joins pushes only once it answered
the controller's challenge at its address under its registration's key; one that does not is retried quickly,
then held back with the push back-off (doubling) and told why; leases never wait for it."""

import threading
import time

from asyncrl.controller.persistence import MemoryStore
from asyncrl.controller.reachability import QUICK_RETRIES_S, ReachabilityChecks
from asyncrl.controller.state import ControllerState
from asyncrl.core.config.schema import ControllerConfig
from asyncrl.core.wire.auth import liveness_mac
from asyncrl.push.coordinator import PushOffer
from tests.conftest import TEST_STORE_KEY
from tests.fakes import TINY_TENSORS, FakeClock, FakeNotifier, MemoryEvents


class Addresses:
    """The probe: who answers at which address, under which key (nobody, by default)."""

    def __init__(self):
        self.keys: dict[str, bytes] = {}
        self.asked: list[str] = []

    def __call__(self, address: str, challenge: bytes) -> bytes:
        self.asked.append(address)
        key = self.keys.get(address)
        return liveness_mac(key, challenge) if key else b""


def state_with(addresses: Addresses, **fields):
    clock, events = FakeClock(), MemoryEvents()
    config = ControllerConfig(eta=None, push_backoff_s=10.0, trust_initial_weights=True, **fields)
    state = ControllerState(config, 8, events=events, notify=FakeNotifier(), probe=addresses, clock=clock)
    state.reachability.close()  # the tests below run the checks themselves, one at a time
    return state, clock, events


def replica(state, replica_id):
    return next(r for r in state.snapshot()["replicas"] if r["replica_id"] == replica_id)


def test_a_replica_that_answers_under_its_key_joins_pushes():
    addresses = Addresses()
    state, _, events = state_with(addresses)
    reg = state.register("127.0.0.1:7001", "r-1", 0, "torch")
    assert not replica(state, "r-1")["reachable"]
    session = state.begin_push(1, PushOffer(store_address="127.0.0.1:29500", store_key=TEST_STORE_KEY, transport="gloo", tensors=TINY_TENSORS, bucket_bytes=1 << 20, timeout_s=5.0))
    assert session.receivers == []  # not reached yet: left out
    assert state.commit_push(session.push_id, sender_ok=True).committed
    addresses.keys["127.0.0.1:7001"] = reg.push_key
    assert state.reachability.check_reachable("r-1", reg.push_key) is None  # settled
    assert replica(state, "r-1")["reachable"] and addresses.asked == ["127.0.0.1:7001"]
    assert events.of_kind("replica_reachable")[0]["failed_checks"] == 0
    assert state.reachability.check_reachable("r-1", reg.push_key) is None and addresses.asked == ["127.0.0.1:7001"]


def test_one_that_does_not_answer_is_retried_quickly_then_held_back_and_told_why():
    addresses = Addresses()
    state, clock, events = state_with(addresses)
    reg = state.register("10.0.0.9:7001", "stray", 0, "torch")
    delays = [state.reachability.check_reachable("stray", reg.push_key) for _ in range(len(QUICK_RETRIES_S) + 2)]
    assert delays == [*QUICK_RETRIES_S, 10.0, 20.0]  # then the push back-off, doubling
    held = events.of_kind("replica_held_back")
    assert [e["seconds"] for e in held] == [10.0, 20.0] and held[0]["address"] == "10.0.0.9:7001"
    pulse = state.heartbeat("stray", 0)
    assert pulse.held_back_s == 20.0 and pulse.push_problem.startswith("unreachable at 10.0.0.9:7001")
    # Leases do not wait for it (it registered with the current weights).
    assert state.admission.try_acquire("stray", 8, time.monotonic(), final=True).granted
    # It answers at last (its address fixed by a restart, say): the hold ends, it joins pushes.
    clock.advance(20.0)
    addresses.keys["10.0.0.9:7001"] = reg.push_key
    assert state.reachability.check_reachable("stray", reg.push_key) is None
    view = replica(state, "stray")
    assert view["reachable"] and view["held_back_s"] == 0 and view["push_problem"] == ""


def test_a_new_registration_needs_its_own_answer_and_stale_checks_stop():
    addresses = Addresses()
    state, _, _ = state_with(addresses)
    first = state.register("127.0.0.1:7001", "r-1", 0, "torch")
    addresses.keys["127.0.0.1:7001"] = first.push_key
    assert state.reachability.check_reachable("r-1", first.push_key) is None
    # It registers again from another address: a new key, unproven until the process there answers under it.
    second = state.register("127.0.0.1:7002", "r-1", 0, "torch", push_key=first.push_key)
    assert not replica(state, "r-1")["reachable"]
    assert state.reachability.check_reachable("r-1", first.push_key) is None  # the old registration's check: nothing to do
    assert state.reachability.check_reachable("r-1", second.push_key) == QUICK_RETRIES_S[0]
    addresses.keys["127.0.0.1:7002"] = second.push_key
    assert state.reachability.check_reachable("r-1", second.push_key) is None and replica(state, "r-1")["reachable"]
    assert state.reachability.check_reachable("gone", b"k" * 32) is None  # never registered (or forgotten)


def test_without_a_probe_every_registration_counts_as_reachable():
    state = ControllerState(ControllerConfig(eta=0), 8, notify=FakeNotifier(), clock=FakeClock())
    state.register("127.0.0.1:7001", "r-1", 0, "torch")
    assert replica(state, "r-1")["reachable"]


def test_checks_run_off_the_callers_thread_and_again_when_they_ask():
    calls, done = [], threading.Event()

    def check(replica_id, key):
        calls.append((replica_id, key, time.monotonic()))
        if len(calls) == 3:
            done.set()
            return None
        return 0.05

    checks = ReachabilityChecks(check, workers=2)
    try:
        started = time.monotonic()
        checks.submit("r-1", b"k", 0.0)
        assert done.wait(5)
        assert [c[:2] for c in calls] == [("r-1", b"k")] * 3
        assert calls[2][2] - started >= 0.1  # two delays of 0.05 s
    finally:
        checks.close()
    time.sleep(0.1)
    assert len(calls) == 3


def test_a_restarted_controller_keeps_who_was_reached_and_checks_the_others_again():
    addresses, store = Addresses(), MemoryStore()
    state = ControllerState(ControllerConfig(eta=None), 8, notify=FakeNotifier(), probe=addresses,
                            clock=FakeClock(), store=store)
    state.reachability.close()
    reached = state.register("127.0.0.1:7001", "reached", 0, "torch")
    state.register("10.0.0.9:7001", "stray", 0, "torch")
    addresses.keys["127.0.0.1:7001"] = reached.push_key
    assert state.reachability.check_reachable("reached", reached.push_key) is None
    again = ControllerState(ControllerConfig(eta=None), 8, notify=FakeNotifier(), probe=addresses,
                            clock=FakeClock(), store=store)  # the controller died; a new one starts on its state
    try:
        assert replica(again, "reached")["reachable"] and not replica(again, "stray")["reachable"]
        deadline = time.monotonic() + 5
        while addresses.asked.count("10.0.0.9:7001") < 2:  # its checks resumed on the new controller's threads
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        again.close()
