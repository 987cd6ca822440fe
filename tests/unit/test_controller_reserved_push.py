"""The next push reserved at a commit (`CommitWeightPush.reserve_next`): when the controller reserves one, that
the learner's commit of it needs no Begin, and that every way a reservation ends leaves the replicas' books
right: used, named unused, superseded, voided by a receiver's new registration, by a death, by a reset."""

import pytest

from asyncrl.core.wire.auth import push_order_mac
from asyncrl.push.plan import PushOffer
from asyncrl.push.protocol import PushRefused
from asyncrl.push.store_rights import member_plan
from tests.conftest import TEST_STORE_KEY
from tests.fakes import TINY_TENSORS, make_state
from tests.unit.test_controller_in_band_push import following, signed_acks

STORE = "127.0.0.1:29500"


def offer(in_band=True, store=STORE):
    return PushOffer(store_address=store, store_key=TEST_STORE_KEY, transport="gloo", tensors=TINY_TENSORS, bucket_bytes=1 << 20, timeout_s=5.0, in_band=in_band)


def in_band_group(state, *ports):
    """Followers at `ports` holding a group (formed by push 1); returns their push keys by replica id."""
    keys = dict(following(state, *ports))
    state.commit_push(state.begin_push(1, offer()).push_id, sender_ok=True)
    return keys


def reserving_commit(state, keys, version):
    """Begin and commit `version` (the controller orders it), asking for the next push; returns the
    reservation (or None)."""
    session = state.begin_push(version, offer())
    result = state.commit_push(session.push_id, True, reserve_next=True)
    assert result.committed and result.current_version == version
    return result.next_push


def test_a_reserved_push_is_committed_without_a_begin():
    state, clock, notifier, events = make_state()
    keys = in_band_group(state, 7001, 7002)
    reserved = reserving_commit(state, keys, 2)
    assert reserved.in_band and reserved.plan.version == 3 and not reserved.plan.new_group
    assert reserved.after_push_id == events.of_kind("push_committed")[-1]["push_id"]
    assert reserved.order_macs == [push_order_mac(keys[r.replica_id], member_plan(reserved.plan, r.rank), r.rank)
                                   for r in reserved.receivers]  # fmt: skip
    # Reserved, not open: a resync request is not held back by it, and no time-out runs on it.
    assert state.books.pushes.open is None and not state.books.pushes.is_fresh(state.books.clock() + 1e6)
    calls = len(notifier.calls)
    clock.advance(40.0)  # the learner's step: the reservation waits, with no time-out
    result = state.commit_push(reserved.push_id, True, acks=signed_acks(reserved, keys), reserve_next=True,
                               learner_seconds=0.004)
    assert result.committed and result.current_version == 3 and sorted(result.acked) == sorted(keys)
    # Timed as the learner measured it (the controller did not see it begin), not from the reservation.
    assert events.of_kind("push_committed")[-1]["seconds"] == pytest.approx(0.004)
    assert state.metrics.push_seconds._sum.get() < 1.0
    assert result.next_push.plan.version == 4 and result.next_push.after_push_id == reserved.push_id
    assert len(notifier.calls) == calls
    assert [e["reserved"] for e in events.of_kind("push_begun")] == [False, False, True, True]
    assert all(r["weight_version"] == 3 and not r["needs_sync"] for r in state.snapshot()["replicas"])


@pytest.mark.parametrize("case", ["not asked", "not offered in-band", "a member does not follow",
                                  "a new replica", "a member dropped", "sender failed"])
def test_nothing_is_reserved_when_the_next_push_cannot_go_in_band(case):
    state, _, notifier, events = make_state()
    in_band_group(state, 7001, 7002)
    if case == "a member does not follow":
        state.register("127.0.0.1:7003", "", 0, "torch")  # the next push forms a group with it
    if case == "a member dropped":
        notifier.failing.add("127.0.0.1:7002")
    session = state.begin_push(2, offer(in_band=case != "not offered in-band"))
    if case == "a new replica":
        following(state, 7003)  # after the Begin: the next push would form a group with it
    result = state.commit_push(session.push_id, case != "sender failed", reserve_next=case != "not asked")
    assert result.next_push is None and state.books.pushes.reserved is None
    assert not [e for e in events.of_kind("push_begun") if e["reserved"]]


def test_a_begin_naming_the_reservation_unused_closes_it_quietly():
    state, _, _, events = make_state()
    keys = in_band_group(state, 7001, 7002)
    reserved = reserving_commit(state, keys, 2)
    # The learner pushes version 3 without it (it was told not to offer in-band pushes any more, say).
    session = state.begin_push(3, offer(in_band=False), unused_push_id=reserved.push_id)
    assert events.of_kind("push_withdrawn")[0]["push_id"] == reserved.push_id
    assert not events.of_kind("push_aborted")
    # Nobody was flagged for a resync, and the group survives a withdrawn reservation.
    assert not any(r["needs_sync"] for r in state.snapshot()["replicas"])
    assert not session.plan.new_group and session.plan.group_id == reserved.plan.group_id


@pytest.mark.parametrize("case", ["not named", "another learner", "named by another learner"])
def test_a_reservation_superseded_otherwise_is_aborted_and_its_receivers_resynced(case):
    state, _, _, events = make_state()
    keys = in_band_group(state, 7001, 7002)
    reserved = reserving_commit(state, keys, 2)
    store = STORE if case == "not named" else "127.0.0.1:29600"
    unused = reserved.push_id if case == "named by another learner" else ""
    session = state.begin_push(2, offer(store=store), unused_push_id=unused)
    (aborted,) = events.of_kind("push_aborted")
    assert aborted["push_id"] == reserved.push_id and not events.of_kind("push_withdrawn")
    # Its receivers may have taken it: they get the version again, on a new group.
    assert sorted(r.replica_id for r in session.receivers) == sorted(keys) and session.plan.new_group
    with pytest.raises(PushRefused, match="push_id"):
        state.commit_push(reserved.push_id, True, acks=signed_acks(reserved, keys))


def test_a_receiver_registering_again_voids_the_reservation():
    state, _, _, events = make_state()
    keys = in_band_group(state, 7001, 7002)
    reserved = reserving_commit(state, keys, 2)
    again = reserved.receivers[0]
    state.register(again.address, again.replica_id, 2, "torch", push_key=keys[again.replica_id], in_band=True)
    assert events.of_kind("push_aborted")[0]["push_id"] == reserved.push_id
    assert "registered again" in events.of_kind("push_aborted")[0]["reason"]
    with pytest.raises(PushRefused, match="is not the open push"):
        state.commit_push(reserved.push_id, True, acks=signed_acks(reserved, keys))
    # The next push forms a new group; a new replica (not a receiver) leaves the reservation after it alone.
    session = state.begin_push(3, offer())
    assert session.plan.new_group and not session.in_band
    other = state.commit_push(session.push_id, True, reserve_next=True).next_push
    following(state, 7009)
    assert other is not None and state.books.pushes.reserved is other


def test_a_receiver_declared_dead_is_dropped_from_the_reserved_push():
    state, clock, _, _ = make_state(heartbeat_timeout_s=3.0)
    keys = in_band_group(state, 7001, 7002)
    reserved = reserving_commit(state, keys, 2)
    dead, alive = reserved.receivers
    clock.advance(2.0)
    state.heartbeat(alive.replica_id, 2)
    clock.advance(2.0)  # `dead` silent for 4 s
    state.liveness.reap()
    result = state.commit_push(reserved.push_id, True, acks=signed_acks(reserved, keys), reserve_next=True)
    assert result.committed and result.acked == [alive.replica_id] and result.dropped == [dead.replica_id]
    assert result.next_push is None  # the group is gone with the drop: the next push forms one


def test_a_timeline_reset_aborts_the_reservation():
    state, _, _, events = make_state()
    keys = in_band_group(state, 7001, 7002)
    reserved = reserving_commit(state, keys, 2)
    state.reset_timeline(1, 0, 0)
    assert events.of_kind("push_aborted")[0]["push_id"] == reserved.push_id
    assert state.books.pushes.reserved is None


def test_a_resync_to_nobody_keeps_the_group_and_reserves_the_next_push():
    """The learner was asked for a resync, but by its Begin nobody lacks the version any more: nothing is
    broadcast, so the members' group (and where they wait for the next order) stays as it was."""
    state, _, _, _ = make_state()
    keys = in_band_group(state, 7001, 7002)
    reserved = reserving_commit(state, keys, 2)
    resync = state.begin_push(2, offer(), unused_push_id=reserved.push_id)
    assert resync.receivers == [] and resync.plan.world_size == 1
    after = state.commit_push(resync.push_id, True, reserve_next=True).next_push
    assert after is not None and after.in_band and after.plan.version == 3
    assert after.plan.group_id == reserved.plan.group_id and after.after_push_id == reserved.after_push_id
    assert state.books.pushes.groups_formed == 1
