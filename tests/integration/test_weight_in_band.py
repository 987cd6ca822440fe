"""The in-band order and ack keys (`push.in_band`) on a real TCPStore in this process."""

import dataclasses
import threading
import time

import pytest

from asyncrl.core.checks.validation import InvalidArgument
from asyncrl.push.broadcast import host_store, push_store
from asyncrl.push.in_band import (
    collect_acks,
    forget_acks,
    order_key,
    parse_order,
    publish_order,
    wait_for_order,
    write_ack,
)
from asyncrl.push.plan import PushPlan
from asyncrl.push.store_rights import UNSENT_KEY
from tests.conftest import TEST_STORE_KEY

PLAN = PushPlan(push_id="push-v2-ab", version=2, store_address="127.0.0.1:29500", store_key=TEST_STORE_KEY, world_size=3, transport="gloo", tensors=(), bucket_bytes=1 << 20, timeout_s=30.0, group_id="group-1",
                new_group=False, manifest_digest="a" * 64)


@pytest.fixture
def store():
    return host_store("127.0.0.1", 0, 10.0)


def test_a_member_waiting_after_the_last_push_gets_the_order_and_its_rank_mac(store):
    got = []
    waiter = threading.Thread(target=lambda: got.append(
        wait_for_order(store, order_key("group-1", "push-v1-cd"), 0.05, lambda: True)))
    waiter.start()
    time.sleep(0.2)  # the member waits before the order is written
    key = publish_order(store, "group-1", "push-v1-cd", PLAN, [b"mac-1", b"mac-2"])
    waiter.join(5)
    assert key == "order/group-1/after/push-v1-cd"
    plan, mac = parse_order(got[0], 2)
    # Every member reads the order: it carries no key, and each member puts in its own for the group.
    assert plan.store_key == UNSENT_KEY and PLAN.store_key != UNSENT_KEY
    assert dataclasses.replace(plan, store_key=PLAN.store_key) == PLAN and mac == b"mac-2"


def test_a_member_stops_waiting_when_told(store):
    calls = []

    def keep_waiting():
        calls.append(1)
        return len(calls) < 3

    started = time.monotonic()
    assert wait_for_order(store, order_key("group-1", "push-v9"), 0.05, keep_waiting) is None
    assert len(calls) == 3 and time.monotonic() - started < 2


@pytest.mark.parametrize("data, rank, field", [
    (b"\xff\xff not a message", 1, "order"),
    (b"", 1, "order.plan"),
    (None, 3, "order.plan.world_size"),
    ("one mac", 1, "order.order_macs"),
])
def test_an_order_that_does_not_parse_names_its_field(store, data, rank, field):
    if data is None or data == "one mac":
        publish_order(store, "g", "p", PLAN, [b"m1", b"m2"] if data is None else [b"m1"])
        data = store.get(order_key("g", "p"))
    with pytest.raises(InvalidArgument) as err:
        parse_order(data, rank)
    assert err.value.field == field


def test_acks_are_collected_per_rank_a_silent_rank_has_none_and_garbage_says_so(store):
    plan = PushPlan(push_id="push-v3", version=3, store_address="127.0.0.1:1", store_key=TEST_STORE_KEY, world_size=5, transport="gloo", tensors=(), bucket_bytes=1, timeout_s=30.0)
    handshake = push_store(store, plan)
    write_ack(handshake, 1, 3, b"mac")
    write_ack(handshake, 2, 0, error="RuntimeError: boom")
    handshake.set("ack/3", b"\xff garbage")
    started = time.monotonic()
    acks = collect_acks(handshake, 5, timeout_s=0.3)  # rank 4 never answers
    assert time.monotonic() - started < 3
    by_rank = {a.rank: a for a in acks}
    assert sorted(by_rank) == [1, 2, 3]
    assert by_rank[1].weight_version == 3 and by_rank[1].ack_mac == b"mac" and not by_rank[1].error
    assert by_rank[2].error == "RuntimeError: boom"
    assert by_rank[3].error and not by_rank[3].ack_mac
    forget_acks(handshake, 5)
    assert not any(handshake.check([f"ack/{r}"]) for r in range(1, 5))


def test_an_ack_under_another_ranks_key_counts_for_nothing(store):
    handshake = push_store(store, PLAN)
    write_ack(handshake, 1, 2, b"mac")
    handshake.set("ack/2", handshake.get("ack/1"))  # rank 1's ack copied under rank 2's key
    by_rank = {a.rank: a for a in collect_acks(handshake, 3, timeout_s=1.0)}
    assert not by_rank[1].error and "names rank 1" in by_rank[2].error and not by_rank[2].ack_mac


def test_the_sender_stops_waiting_for_an_ack_from_a_receiver_that_is_gone(store):
    plan = PushPlan(push_id="push-v4", version=4, store_address="127.0.0.1:1", store_key=TEST_STORE_KEY, world_size=3, transport="gloo", tensors=(), bucket_bytes=1, timeout_s=30.0)
    handshake = push_store(store, plan)
    write_ack(handshake, 1, 4, b"mac")
    asked = []

    def gone(rank):
        asked.append(rank)
        return rank == 2

    started = time.monotonic()
    acks = collect_acks(handshake, 3, timeout_s=30.0, gone=gone, check_every_s=0.1)
    assert time.monotonic() - started < 5 and asked == [2]
    assert [a.rank for a in acks] == [1]
