"""A restarted controller continues from its saved state: version, N_r, prompt cursor, leases, replicas."""

import pytest

from asyncrl.controller.errors import PreconditionFailed
from asyncrl.controller.persistence import MemoryStore, StateOfAnotherRun
from tests.fakes import acquire, make_state
from tests.unit.test_controller_leases import publish


def test_restart_continues_with_exact_accounting():
    store = MemoryStore()
    state, _, _, _ = make_state(batch_size=4, eta=1, store=store)
    a = state.register("127.0.0.1:7001", "replica-a", 0, "torch")
    b = state.register("127.0.0.1:7002", "replica-b", 0, "torch")
    assert publish(state, 1).committed
    leases = [acquire(state, "replica-a", 2, 0) for _ in range(3)]
    assert all(x.granted for x in leases)
    state.admission.complete("replica-a", leases[0].lease_id, 1)  # one trajectory's quota returns
    before = state.snapshot()

    again, _, _, _ = make_state(batch_size=4, eta=1, store=store)  # the process died; a new one starts
    after = again.snapshot()
    for key in ("current_version", "admitted", "next_prompt_index", "leases_granted", "pushes_committed"):
        assert after[key] == before[key], key
    assert after["admitted"] == 5 and after["current_version"] == 1 and after["next_prompt_index"] == 3
    assert again.restored == {"version": 1, "admitted": 5, "next_prompt_index": 3, "leases": 2, "replicas": 2}
    # Replicas keep their ids, rank order and push keys (pushes they verify stay valid).
    assert [r["replica_id"] for r in after["replicas"]] == ["replica-a", "replica-b"]
    pulse = again.heartbeat("replica-b", 1, [])
    assert not pulse.needs_sync and pulse.current_version == 1
    assert again.books.registry.get("replica-a").push_key == a.push_key
    assert again.books.registry.get("replica-b").push_key == b.push_key
    # The restored leases can be completed by their holder; an ended one stays ended.
    assert again.admission.complete("replica-a", leases[1].lease_id, 2) == 0
    with pytest.raises(PreconditionFailed):
        again.admission.complete("replica-a", leases[0].lease_id, 2)
    # η accounting continues exactly: (i + η + 1) * B = 12 at version 1; 5 admitted: 3 more leases of 2 fit.
    granted = 0
    while acquire(again, "replica-b", 2, 0).granted:
        granted += 2
    assert again.admitted == 11 and granted == 6


def test_a_heartbeat_that_changes_nothing_writes_nothing():
    store = MemoryStore()
    state, _, _, _ = make_state(store=store)
    state.register("127.0.0.1:7001", "replica-a", 0, "torch")
    saves = store.saves
    for _ in range(5):
        state.heartbeat("replica-a", 0, [])
    assert store.saves == saves
    acquire(state, "replica-a", 4, 0)
    assert store.saves == saves + 1  # a grant is one write, before the answer


def test_restored_lease_of_a_replica_that_never_returns_expires_and_returns_its_quota():
    store = MemoryStore()
    state, _, _, _ = make_state(batch_size=4, eta=0, store=store, lease_ttl_s=30.0, heartbeat_timeout_s=10.0)
    state.register("127.0.0.1:7001", "replica-a", 0, "torch")
    assert acquire(state, "replica-a", 4, 0).granted
    again, clock, _, events = make_state(batch_size=4, eta=0, store=store, lease_ttl_s=30.0,
                                         heartbeat_timeout_s=10.0)
    assert again.admitted == 4
    clock.advance(11.0)  # silent past the heartbeat time-out: declared dead, its lease returns its quota
    again.liveness.reap()
    assert again.admitted == 0
    assert [e["reason"] for e in events.of_kind("lease_expired")] == ["replica_dead"]


def test_state_of_another_run_is_refused_with_the_key_named():
    store = MemoryStore()
    make_state(store=store, run_id="runs/a")
    with pytest.raises(StateOfAnotherRun, match="controller.state_key"):
        make_state(store=store, run_id="runs/b")


def test_cleared_store_starts_from_the_config():
    store = MemoryStore()
    state, _, _, _ = make_state(store=store)
    state.register("127.0.0.1:7001", "replica-a", 0, "torch")
    store.clear()
    again, _, _, _ = make_state(store=store, start_version=3, start_admitted=24, start_prompt_index=6)
    assert again.restored is None
    assert (again.current_version, again.admitted) == (3, 24)


def test_timeline_reset_goes_back_to_the_checkpoint():
    from tests.unit.test_controller_leases import publish

    state, _, _, events = make_state(batch_size=4, eta=1)
    state.register("127.0.0.1:7001", "replica-a", 0, "torch")
    for version in (1, 2, 3):
        assert publish(state, version).committed
    leases = [acquire(state, "replica-a", 2, 0) for _ in range(2)]
    assert all(x.granted for x in leases)
    cursor_before = state.snapshot()["next_prompt_index"]
    with pytest.raises(PreconditionFailed, match="version: 4 is ahead"):
        state.reset_timeline(4, 0, 0)
    reset = state.reset_timeline(version=1, admitted=6, prompt_index=1)
    # Back at the checkpoint's version with its N_r; the lost timeline's leases expired; the prompt cursor did
    # not move back (a late group of an expired lease is told apart by its prompt index).
    assert (reset.current_version, reset.leases_expired, reset.prompt_index) == (1, 2, cursor_before)
    assert (state.current_version, state.admitted) == (1, 6)
    assert [e["reason"] for e in events.of_kind("lease_expired")] == ["timeline_reset"] * 2
    # Every replica may hold weights of the lost timeline: no lease until a push reaches it.
    refused = acquire(state, "replica-a", 2, 0)
    assert not refused.granted and "weight sync" in refused.reason
    assert state.learner_heartbeat(0, 1, 0).sync_requested


def test_replicas_ahead_of_a_reset_timeline_are_taken_and_resynced():
    """A learner restarted from an older checkpoint resets the timeline below what the replicas hold (version
    3 here, back to 1). Their heartbeats and new registrations carry the lost timeline's versions: taken, each
    replica flagged for a resync (it used to be refused, and the replicas never came back). One registering
    with a version the new timeline reaches again (2) is resynced too: the number may name lost weights."""
    from tests.unit.test_controller_leases import publish

    state, _, _, _ = make_state(batch_size=4, eta=1)
    state.register("127.0.0.1:7001", "replica-a", 0, "torch")
    for version in (1, 2, 3):
        assert publish(state, version).committed
    state.reset_timeline(version=1, admitted=0, prompt_index=0)
    assert state.heartbeat("replica-a", 3).needs_sync
    ahead = state.register("127.0.0.1:7002", "replica-b", 3, "torch")
    assert ahead.needs_sync and ahead.current_version == 1
    assert publish(state, 2).committed  # reaches both: the new timeline's version 2
    assert not state.heartbeat("replica-a", 2).needs_sync and not state.heartbeat("replica-b", 2).needs_sync
    again = state.register("127.0.0.1:7003", "replica-c", 2, "torch")
    assert again.needs_sync
    granted = acquire(state, "replica-a", 2, 0)
    assert granted.granted
