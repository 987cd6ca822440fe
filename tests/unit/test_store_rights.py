"""What a push member may send to the learner's store (`push/store_rights.py`): torch's TCPStore commands read
from the bytes its client sends, and each judged against the member's own keys, as a table."""

from __future__ import annotations

import struct

import pytest

from asyncrl.push.plan import PushPlan
from asyncrl.push.store_rights import (
    MAX_VALUE_BYTES,
    UNSENT_KEY,
    Command,
    CommandReader,
    Deferred,
    Member,
    Op,
    OpenPushes,
    Refused,
    judge,
    member_key,
    member_plan,
)


def key(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


def value(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


# What torch 2.13's client sends (read off the wire through a relay): a connection's first bytes, a set, a
# compare-and-set, a wait of one key and its cancel.
VALIDATE = bytes([0]) + struct.pack("<I", 0x3C85F7CE)
PING = bytes([13]) + struct.pack("<I", 27371)
SET = bytes([1]) + key("/push/p1//ready/2") + value(b"ok")
COMPARE_SET = bytes([2]) + key("/current_push") + value(b"") + value(b"")
WAIT = bytes([6]) + struct.pack("<Q", 1) + key("/push/p1//verdict")
CANCEL = bytes([12])


def test_the_reader_splits_a_stream_into_commands_wherever_it_is_cut():
    stream = VALIDATE + PING + SET + COMPARE_SET + WAIT + CANCEL
    for cut in range(1, len(stream)):
        reader = CommandReader()
        commands = reader.feed(stream[:cut]) + reader.feed(stream[cut:])
        assert [c.op for c, _ in commands] == [Op.VALIDATE, Op.PING, Op.SET, Op.COMPARE_SET, Op.WAIT,
                                               Op.CANCEL_WAIT], cut  # fmt: skip
        assert b"".join(raw for _, raw in commands) == stream
    (set_command, _), (cas, _) = CommandReader().feed(SET + COMPARE_SET)
    assert set_command.keys == ("/push/p1//ready/2",) and set_command.values == (b"ok",)
    assert cas.keys == ("/current_push",) and cas.values == (b"", b"")


def test_the_reader_refuses_a_size_over_its_bound_before_the_bytes_arrive():
    reader = CommandReader()
    with pytest.raises(Refused, match="a value of 1073741824 bytes"):
        reader.feed(bytes([1]) + key("/push/p1//ack/2") + struct.pack("<Q", 1 << 30))
    with pytest.raises(Refused, match="command type 99"):
        CommandReader().feed(bytes([99]))
    with pytest.raises(Refused, match="key count"):
        CommandReader().feed(bytes([10]) + struct.pack("<Q", 1 << 20))
    assert CommandReader().feed(bytes([1]) + key("/a") + struct.pack("<Q", MAX_VALUE_BYTES)) == []  # waits


MEMBER = Member("group/g1/", 2)


def pushes() -> OpenPushes:
    opened = OpenPushes()
    opened.open("p1", "group/g1/", 3)
    opened.open("p2", "group/g2/", 3)
    opened.open("p3", "group/g1/", 2)
    return opened


ALLOWED = [
    (Op.SET, ("/push/p1//ready/2",), (b"ok",)),
    (Op.SET, ("/push/p1//ready/2",), (b"no-group",)),
    (Op.SET, ("/push/p1//ack/2",), (b"x" * 1024,)),
    (Op.SET, ("/group/g1//0/2",), (b"address" * 20,)),
    (Op.COMPARE_SET, ("/current_push",), (b"", b"")),
    (Op.COMPARE_SET, ("/order/g1/after/p1",), (b"", b"wake")),
    (Op.GET, ("/push/p2//verdict",), ()),
    (Op.WAIT, ("/push/p1//verdict", "/manifest/abc"), ()),
    (Op.CHECK, ("/anything",), ()),
    (Op.MULTI_GET, ("/a", "/b"), ()),
    (Op.VALIDATE, (), ()),
    (Op.PING, (), ()),
    (Op.CANCEL_WAIT, (), ()),
    (Op.GETNUMKEYS, (), ()),
]

REFUSED = [
    (Op.SET, ("/push/p1//verdict",), (b"abort: forged",), "not this member's to write"),
    (Op.SET, ("/push/p1//ready/1",), (b"ok",), "rank 2 writes only its own keys"),
    (Op.SET, ("/push/p1//ready/2",), (b"unreachable",), "must be ok or no-group"),
    (Op.SET, ("/push/p1//ack/2",), (b"x" * 20_000,), "at most 16384 bytes"),
    (Op.SET, ("/push/p2//ready/2",), (b"ok",), "not on this member's group"),
    (Op.SET, ("/push/p3//ready/2",), (b"ok",), "has no rank 2"),
    (Op.SET, ("/group/g1//0/1",), (b"address",), "not this member's to write"),
    (Op.SET, ("/group/g2//0/2",), (b"address",), "not this member's to write"),
    (Op.SET, ("/group/g1//0/2",), (b"x" * 5000,), "an address of at most"),
    (Op.SET, ("/current_push",), (b"p9",), "not this member's to write"),
    (Op.SET, ("/manifest/abc",), (b"{}",), "not this member's to write"),
    (Op.COMPARE_SET, ("/current_push",), (b"", b"p9"), "not this member's to write"),
    (Op.COMPARE_SET, ("/order/g1/after/p1",), (b"", b"order"), "not this member's to write"),
    (Op.COMPARE_SET, ("/order/g2/after/p2",), (b"", b"wake"), "not this member's to write"),
    (Op.COMPARE_SET, ("/push/p1//ready/1",), (b"", b"unreachable"), "not this member's to write"),
    (Op.DELETE_KEY, ("/push/p1//verdict",), (), "members do not send it"),
    (Op.ADD, ("/counter",), (), "members do not send it"),
    (Op.APPEND, ("/push/p1//ready/2",), (b"x",), "members do not send it"),
]


@pytest.mark.parametrize(("op", "keys", "values"), ALLOWED)
def test_a_member_sends_what_its_rank_sends(op, keys, values):
    judge(Command(op, keys, values), MEMBER, pushes())


@pytest.mark.parametrize(("op", "keys", "values", "why"), REFUSED)
def test_a_member_sends_nothing_else(op, keys, values, why):
    with pytest.raises(Refused, match=why):
        judge(Command(op, keys, values), MEMBER, pushes())


def test_a_write_into_a_push_not_opened_yet_waits_for_it():
    with pytest.raises(Deferred) as later:
        judge(Command(Op.SET, ("/push/p9//ready/2",), (b"ok",)), MEMBER, pushes())
    assert later.value.push_id == "p9"
    opened = pushes()
    opened.open("p9", "group/g1/", 3)
    judge(Command(Op.SET, ("/push/p9//ready/2",), (b"ok",)), MEMBER, opened)


def test_member_keys_are_one_per_group_and_rank_and_identities_parse_strictly():
    store_key = bytes(range(32))
    keys = {member_key(store_key, Member(group, rank)) for group in ("group/g1/", "group/g2/") for rank in (1, 2)}
    assert len(keys) == 4 and store_key not in keys
    assert Member.parse(b"push/p1/group/\n3") == Member("push/p1/group/", 3)
    for junk in (b"", b"group/g1/", b"group/g1/\n0", b"group/g1/\nx", b"manifest/\n1", b"group/../\n1",
                 b"group/g1/\n1\n2"):
        with pytest.raises(Refused):
            Member.parse(junk)


def test_a_plan_ordered_to_a_rank_carries_its_member_key_never_the_stores():
    plan = PushPlan(push_id="p1", version=1, store_address="127.0.0.1:1", store_key=bytes(range(32)), world_size=3,
                    transport="gloo", bucket_bytes=1, timeout_s=1, group_id="g1", new_group=True)
    ordered = member_plan(plan, 2)
    assert ordered.store_key == member_key(plan.store_key, Member("group/g1/", 2))
    assert ordered.store_key not in (plan.store_key, UNSENT_KEY, member_plan(plan, 1).store_key)
    assert ordered.push_id == plan.push_id and ordered.world_size == plan.world_size


def test_the_values_it_allows_are_the_ones_the_push_writes():
    """The module spells the ready states and the wake itself (it stays torch-free for the controller)."""
    from asyncrl.push import in_band, rendezvous, store_rights

    assert store_rights._READY_STATES == (rendezvous.READY, rendezvous.NO_GROUP)
    assert store_rights._WAKE == in_band.WAKE
    assert store_rights._CURRENT_PUSH == "/" + rendezvous.CURRENT_PUSH
