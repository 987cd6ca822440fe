"""ControllerState replicas: registration, ids, heartbeats, death and revival, restarts, the snapshot."""

import pytest

from asyncrl.controller.errors import InvalidRequest
from asyncrl.controller.registry import UNPROVEN
from asyncrl.controller.status_page import render_html
from tests.fakes import acquire, begin, make_state


def test_ids_are_assigned_and_chosen_ids_are_kept():
    state, _, _, events = make_state()
    assert state.register("127.0.0.1:7001", "replica-1", 0, "torch").replica_id == "replica-1"
    assert state.register("127.0.0.1:7002", "", 0, "vllm").replica_id == "replica-2"  # skips the taken one
    assert state.register("127.0.0.1:7003", "edge-a", 0, "torch").replica_id == "edge-a"
    first = events.of_kind("replica_registered")[0]
    assert first["address"] == "127.0.0.1:7001" and first["reregistered"] is False


def test_base_checkpoint_is_version_0():
    state, _, _, _ = make_state()
    registration = state.register("127.0.0.1:7001", "", 0, "torch")
    assert registration.current_version == 0 and not registration.needs_sync
    assert state.register("127.0.0.1:7002", "", 3, "torch").needs_sync  # weights from another run


def test_registration_answers_the_heartbeat_interval():
    state, _, _, _ = make_state(heartbeat_interval_s=0.5)
    assert state.register("127.0.0.1:7001", "", 0, "torch").heartbeat_interval_s == 0.5


def test_restart_under_the_same_id_expires_old_leases():
    state, _, _, events = make_state(batch_size=4, eta=0)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    acquire(state, rid, 4, 0)
    assert state.admitted == 4
    state.register("127.0.0.1:7999", rid, 0, "torch")
    assert state.admitted == 0
    assert events.of_kind("lease_expired")[0]["reason"] == "reregistered"
    assert events.of_kind("replica_registered")[-1]["reregistered"] is True
    assert state.snapshot()["replicas"][0]["address"] == "127.0.0.1:7999"


def test_silent_replica_dies_and_a_heartbeat_revives_it():
    state, clock, _, events = make_state(heartbeat_timeout_s=3.0)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    clock.advance(2.0)
    state.liveness.reap()
    assert state.snapshot()["replicas"][0]["alive"]
    clock.advance(2.0)
    state.liveness.reap()
    (dead,) = events.of_kind("replica_dead")
    assert dead["replica_id"] == rid and dead["silent_s"] == pytest.approx(4.0)
    view = state.snapshot()["replicas"][0]
    assert not view["alive"] and view["dead_reason"] == "silent for 4 s (controller.heartbeat_timeout_s 3 s)"
    assert "dead: silent for 4 s" in render_html(state.snapshot())
    assert state.metrics.registry.get_sample_value("asyncrl_controller_live_replicas") == 0
    state.heartbeat(rid, 0)
    view = state.snapshot()["replicas"][0]
    assert view["alive"] and view["dead_reason"] == ""
    assert events.of_kind("replica_revived")[0]["replica_id"] == rid


def test_a_replica_earns_its_leases_by_acknowledging_a_push_not_by_claiming_a_version():
    """A token holder's replica with no engine behind it claimed the current version (registering, then in
    every heartbeat) and got leases. The controller now holds the version of the last push a replica
    acknowledged: a claim moves nothing, and a push of the current version (the learner's push of version 0
    at a fresh run's start, a resync later) is what lets a replica in."""
    state, _, _, _ = make_state(batch_size=4, eta=1, trust_initial_weights=False)
    real = state.register("127.0.0.1:7001", "", 0, "torch")
    assert real.needs_sync and not acquire(state, real.replica_id, 4, 0).granted
    first = begin(state, 0)  # version 0, as the learner pushes it while it waits for its first batch
    assert state.commit_push(first.push_id, sender_ok=True).acked == [real.replica_id]
    assert acquire(state, real.replica_id, 4, 0).granted
    state.commit_push(begin(state, 1).push_id, sender_ok=True)
    claimer = state.register("127.0.0.1:7002", "", 1, "torch")  # claims the current version
    assert claimer.needs_sync
    views = {r["replica_id"]: r for r in state.snapshot()["replicas"]}
    assert views[claimer.replica_id]["weight_version"] == UNPROVEN and views[real.replica_id]["weight_version"] == 1
    for claim in (1, 2, 2**53):  # heartbeats claiming the current version, or beyond it
        assert state.heartbeat(claimer.replica_id, claim).needs_sync
    refused = acquire(state, claimer.replica_id, 4, 0)
    assert not refused.granted and "needs a weight sync" in refused.reason
    assert state.heartbeat(real.replica_id, 0).needs_sync is False  # nor does a claim move a proven version down
    resync = begin(state, 1)
    assert [r.replica_id for r in resync.receivers] == [claimer.replica_id]
    assert state.commit_push(resync.push_id, sender_ok=True).acked == [claimer.replica_id]
    assert acquire(state, claimer.replica_id, 4, 0).granted


def test_with_trust_initial_weights_a_claim_of_version_0_is_believed_and_no_other():
    state, _, _, _ = make_state(trust_initial_weights=True)
    assert not state.register("127.0.0.1:7001", "", 0, "torch").needs_sync
    assert state.register("127.0.0.1:7002", "", 3, "torch").needs_sync


def test_heartbeat_of_an_unknown_replica_names_the_field():
    state, _, _, _ = make_state()
    with pytest.raises(InvalidRequest, match="^replica_id: unknown replica 'ghost'"):
        state.heartbeat("ghost", 0)


def test_snapshot_lists_what_the_status_page_shows():
    state, clock, _, _ = make_state(batch_size=8, eta=2)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    acquire(state, rid, 4, 0)
    clock.advance(1.5)
    state.learner_heartbeat(step=3, version=0, consumed=24)
    snap = state.snapshot()
    assert snap["current_version"] == 0 and snap["admitted"] == 4
    assert snap["batch_size"] == 8 and snap["eta"] == 2 and snap["max_admissible"] == 24
    assert snap["active_leases"] == 1 and snap["leases_granted"] == 1 and snap["next_prompt_index"] == 1
    assert snap["learner"]["step"] == 3 and snap["learner"]["consumed"] == 24
    (replica,) = snap["replicas"]
    assert replica["replica_id"] == rid and replica["engine"] == "torch" and replica["active_leases"] == 1
    assert replica["last_heartbeat_age_s"] == pytest.approx(1.5)


def test_dead_replicas_are_forgotten_and_the_registry_is_bounded():
    from asyncrl.controller.errors import RegistryFull, UnknownReplica

    state, clock, _, events = make_state(heartbeat_timeout_s=3.0, forget_dead_after_s=10.0, max_replicas=2)
    state.register("127.0.0.1:7001", "a", 0, "torch")
    state.register("127.0.0.1:7002", "b", 0, "torch")
    with pytest.raises(RegistryFull, match="max_replicas"):
        state.register("127.0.0.1:7003", "c", 0, "torch")
    state.register("127.0.0.1:7009", "a", 0, "torch")  # an existing id may register again (a restart)
    clock.advance(5.0)
    state.heartbeat("b", 0)
    state.liveness.reap()  # "a" is dead now, not yet forgotten
    assert {r["replica_id"] for r in state.snapshot()["replicas"]} == {"a", "b"}
    clock.advance(11.0)
    state.heartbeat("b", 0)
    state.liveness.reap()
    assert [r["replica_id"] for r in state.snapshot()["replicas"]] == ["b"]
    assert events.of_kind("replica_forgotten")[0]["replica_id"] == "a"
    with pytest.raises(UnknownReplica):
        state.heartbeat("a", 0)  # told NOT_FOUND at the edge: it registers again
    state.register("127.0.0.1:7003", "c", 0, "torch")  # room again


def test_a_full_registry_takes_a_dead_replicas_slot_and_each_caller_host_is_capped():
    """Fakes cannot keep real replicas out: one caller host holds at most max_replicas_per_host live
    registrations (counted by where the call came from, not the address it names), and a registration into a
    full registry takes the slot of the replica dead the longest instead of waiting forget_dead_after_s."""
    from asyncrl.controller.errors import RegistryFull

    state, clock, _, events = make_state(heartbeat_timeout_s=3.0, forget_dead_after_s=600.0, max_replicas=3,
                                         max_replicas_per_host=2)
    state.register("10.9.9.9:1", "a", 0, "torch", caller_host="10.0.0.1")
    state.register("10.9.9.9:2", "b", 0, "torch", caller_host="10.0.0.1")
    with pytest.raises(RegistryFull, match="2 live replicas registered from 10.0.0.1 .*max_replicas_per_host"):
        state.register("10.0.0.2:1", "x", 0, "torch", caller_host="10.0.0.1")
    state.register("10.0.0.1:1", "a", 0, "torch", caller_host="10.0.0.1")  # a restart of one of its own: allowed
    state.register("10.0.0.2:1", "c", 0, "torch", caller_host="10.0.0.2")
    with pytest.raises(RegistryFull, match="3 replicas registered .*max_replicas"):
        state.register("10.0.0.3:1", "d", 0, "torch", caller_host="10.0.0.3")
    clock.advance(2.0)
    state.heartbeat("b", 0)
    clock.advance(2.0)
    state.heartbeat("c", 0)
    state.liveness.reap()  # "a" silent for 4 s: dead, and the registry is still full
    state.register("10.0.0.3:1", "d", 0, "torch", caller_host="10.0.0.3")
    assert [r["replica_id"] for r in state.snapshot()["replicas"]] == ["b", "c", "d"]
    assert [e["replica_id"] for e in events.of_kind("replica_forgotten")] == ["a"]
    clock.advance(4.0)
    for rid in ("c", "d"):
        state.heartbeat(rid, 0)
    state.liveness.reap()  # "b" dead now: 10.0.0.1 has no live replica, and the full registry has a dead one
    state.register("10.0.0.1:2", "e", 0, "torch", caller_host="10.0.0.1")
    assert [r["replica_id"] for r in state.snapshot()["replicas"]] == ["c", "d", "e"]


def _state_with_probe(answers):
    """A state whose liveness probe answers from `answers` (address -> callable(challenge) -> bytes)."""
    from asyncrl.controller.state import ControllerState
    from asyncrl.core.config.schema import ControllerConfig
    from tests.fakes import FakeClock, FakeNotifier

    calls = []

    def probe(address, challenge):
        calls.append(address)
        return answers.get(address, lambda _c: b"")(challenge)

    state = ControllerState(ControllerConfig(eta=0), 8, notify=FakeNotifier(), probe=probe, clock=FakeClock())
    return state, calls


def test_a_live_holder_that_proves_its_key_keeps_its_id():
    from asyncrl.controller.errors import ReplicaIdInUse
    from asyncrl.core.wire.auth import liveness_mac

    answers = {}
    state, calls = _state_with_probe(answers)
    first = state.register("127.0.0.1:7001", "a", 0, "torch")
    answers["127.0.0.1:7001"] = lambda challenge: liveness_mac(first.push_key, challenge)
    with pytest.raises(ReplicaIdInUse, match="replica_id: 'a' is registered by a live replica at 127.0.0.1:7001"):
        state.register("10.0.0.66:6666", "a", 0, "torch")
    assert calls == ["127.0.0.1:7001"]
    assert state.snapshot()["replicas"][0]["address"] == "127.0.0.1:7001"  # pushes still go to the holder


def test_an_id_whose_holder_is_gone_or_cannot_prove_it_is_taken_over():
    from asyncrl.core.wire.auth import liveness_mac

    answers = {"127.0.0.1:7001": lambda challenge: liveness_mac(b"some other key", challenge)}
    state, calls = _state_with_probe(answers)
    first = state.register("127.0.0.1:7001", "a", 0, "torch")
    second = state.register("127.0.0.1:7002", "a", 0, "torch")  # a restart: the old process has another key
    assert second.push_key != first.push_key and calls == ["127.0.0.1:7001"]
    third = state.register("127.0.0.1:7003", "a", 0, "torch")  # nothing answers at 7002 (a dead process)
    assert third.push_key != second.push_key and calls[-1] == "127.0.0.1:7002"
    assert state.snapshot()["replicas"][0]["address"] == "127.0.0.1:7003"


def test_the_holder_itself_may_register_again_with_its_key():
    from asyncrl.core.wire.auth import liveness_mac

    answers = {}
    state, calls = _state_with_probe(answers)
    first = state.register("127.0.0.1:7001", "a", 0, "torch")
    answers["127.0.0.1:7001"] = lambda challenge: liveness_mac(first.push_key, challenge)
    again = state.register("127.0.0.1:7001", "a", 0, "torch", push_key=first.push_key)
    assert again.replica_id == "a" and again.push_key != first.push_key and calls == []
