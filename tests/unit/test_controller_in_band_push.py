"""In-band pushes in the controller: when it leaves a push to the learner (reserved at a commit, on a kept
group every member follows, for a learner that offers it), the orders it signs, and which relayed acks it
counts. BeginWeightPush itself always answers a push the controller orders."""

import hashlib
import hmac

import pytest

from asyncrl.core.wire.auth import push_ack_mac, push_order_mac
from asyncrl.push.plan import PushOffer
from asyncrl.push.protocol import PushRefused
from asyncrl.push.session import ReceiverAck
from asyncrl.push.store_rights import member_plan
from tests.conftest import TEST_STORE_KEY
from tests.fakes import TINY_TENSORS, make_state


def begin(state, version, in_band=True):
    return state.begin_push(version, PushOffer(store_address="127.0.0.1:29500", store_key=TEST_STORE_KEY, transport="gloo", tensors=TINY_TENSORS, bucket_bytes=1 << 20, timeout_s=5.0,
                                               in_band=in_band))


def reserved_after(state, version, in_band=True):
    """Begin `version` (the controller orders it) and commit it asking for the next push: the reservation."""
    session = begin(state, version, in_band)
    result = state.commit_push(session.push_id, sender_ok=True, reserve_next=True)
    assert result.committed
    return result.next_push


def following(state, *ports):
    """Replicas that registered as following their groups: (replica id, push key) each."""
    regs = [state.register(f"127.0.0.1:{port}", "", 0, "torch", in_band=True) for port in ports]
    return [(r.replica_id, r.push_key) for r in regs]


def signed_acks(session, keys, version=None):
    version = session.plan.version if version is None else version
    return tuple(ReceiverAck(r.rank, version, push_ack_mac(keys[r.replica_id], session.push_id, r.rank, version))
                 for r in session.receivers)


def test_a_reused_group_of_followers_goes_in_band_with_signed_orders_and_no_calls():
    state, _, notifier, events = make_state()
    keys = dict(following(state, 7001, 7002))
    first = begin(state, 1)
    assert not first.in_band and first.plan.new_group  # forming the group: the controller orders it
    second = state.commit_push(first.push_id, sender_ok=True, reserve_next=True).next_push
    calls = len(notifier.calls)
    assert second.in_band and not second.plan.new_group and second.after_push_id == first.push_id
    # Each rank's order is signed over the plan with its own member key (the published plan carries none).
    assert second.order_macs == [push_order_mac(keys[r.replica_id], member_plan(second.plan, r.rank), r.rank)
                                 for r in second.receivers]  # fmt: skip
    result = state.commit_push(second.push_id, sender_ok=True, acks=signed_acks(second, keys), reserve_next=True)
    assert result.committed and result.current_version == 2 and sorted(result.acked) == sorted(keys)
    assert len(notifier.calls) == calls  # nobody was called for the in-band push
    assert [e["in_band"] for e in events.of_kind("push_begun")] == [False, True, True]
    assert [e["in_band"] for e in events.of_kind("push_committed")] == [False, True]
    assert state.metrics.pushes_in_band._value.get() == 1
    third = result.next_push
    assert third.in_band and third.after_push_id == second.push_id  # the members wait after the last push
    assert not begin(state, 3, in_band=True).in_band  # a Begin (the reservation named unused) is ordered
    assert all(r["weight_version"] == 2 for r in state.snapshot()["replicas"])


@pytest.mark.parametrize("case", ["not offered", "a member does not follow", "membership changed"])
def test_the_controller_orders_the_push_itself_otherwise(case):
    state, _, notifier, _ = make_state()
    following(state, 7001)
    if case == "a member does not follow":
        state.register("127.0.0.1:7002", "", 0, "torch")
    if case == "membership changed":
        state.commit_push(begin(state, 1).push_id, sender_ok=True)
        following(state, 7003)
        session = begin(state, 2)
        assert session.plan.new_group
    else:
        assert reserved_after(state, 1, in_band=case != "not offered") is None
        session = begin(state, 2, in_band=case != "not offered")
    assert not session.in_band and session.order_macs == [] and session.after_push_id == ""
    result = state.commit_push(session.push_id, sender_ok=True)
    assert result.committed and len(result.acked) == len(session.receivers)
    assert {addr for addr, *_ in notifier.calls[-len(session.receivers):]} == {r.address for r in session.receivers}


def test_only_acks_signed_by_the_replica_for_the_plans_version_count():
    state, _, _, events = make_state()
    ids = following(state, 7001, 7002, 7003, 7004)
    keys = dict(ids)
    session = reserved_after(state, 1)
    good, forged, stale, failed = session.receivers
    acks = (
        signed_acks(session, keys)[0],
        ReceiverAck(forged.rank, 2, push_ack_mac(b"not its key", session.push_id, forged.rank, 2)),
        ReceiverAck(stale.rank, 1, push_ack_mac(keys[stale.replica_id], session.push_id, stale.rank, 1)),
        ReceiverAck(failed.rank, 0, b"", "RuntimeError: out of memory"),
    )
    result = state.commit_push(session.push_id, sender_ok=True, acks=acks)
    assert result.committed and result.acked == [good.replica_id]
    assert result.dropped == [forged.replica_id, stale.replica_id, failed.replica_id]
    errors = {e["replica_id"]: e["error"] for e in events.of_kind("replica_dropped")}
    assert "not signed under its push key" in errors[forged.replica_id]
    assert "reports version 1" in errors[stale.replica_id]
    assert "out of memory" in errors[failed.replica_id]
    assert state.heartbeat(forged.replica_id, 2).needs_sync  # flagged for a resync, not trusted
    assert begin(state, 3).plan.new_group  # a drop forgets the group: the next push forms a new one


def test_a_receiver_without_an_ack_is_dropped():
    state, _, _, _ = make_state()
    keys = dict(following(state, 7001, 7002))
    session = reserved_after(state, 1)
    result = state.commit_push(session.push_id, sender_ok=True, acks=signed_acks(session, keys)[:1])
    assert result.acked == [session.receivers[0].replica_id] and result.dropped == [session.receivers[1].replica_id]


def test_acks_for_a_push_the_controller_ordered_are_refused():
    state, _, _, _ = make_state()
    keys = dict(following(state, 7001))
    session = begin(state, 1)  # forms the group: ordered by the controller
    with pytest.raises(PushRefused, match="^acks: "):
        state.commit_push(session.push_id, sender_ok=True, acks=signed_acks(session, keys))
    assert state.commit_push(session.push_id, sender_ok=True).committed  # the refusal did not start the commit


def test_the_ack_mac_is_the_documented_text_under_the_key():
    """weights.proto documents the signed text (an outside replica must produce it byte for byte)."""
    text = "ack\npush-v3-ab\n2\n3"
    assert push_ack_mac(b"key", "push-v3-ab", 2, 3) == hmac.new(b"key", text.encode(), hashlib.sha256).digest()


def test_following_is_kept_across_a_controller_restart():
    from asyncrl.controller.persistence import MemoryStore

    store = MemoryStore()
    state, _, _, _ = make_state(store=store)
    following(state, 7001)
    restarted, _, _, _ = make_state(store=store)
    assert [r.in_band for r in restarted.books.registry.all()] == [True]
