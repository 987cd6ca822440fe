"""The learner's push store behind its gate (`push/store_gate.py`), attacked as someone who only reaches its port:
no command reaches the store, a forged verdict never calls a push off, a proof seen once is worth nothing again,
a flood of connections and bytes costs the learner a few MB, and the members' push goes through meanwhile."""

from __future__ import annotations

import dataclasses
import datetime
import gc
import hashlib
import hmac
import os
import socket
import threading
import time

import psutil
import pytest
import torch
from torch.distributed import DistError, TCPStore

from asyncrl.core.wire.push_contract import tensor_metas
from asyncrl.push.broadcast import (
    host_store,
    make_group,
    open_push,
    push_store,
)
from asyncrl.push.plan import PushPlan
from asyncrl.push.store_client import gated_client
from asyncrl.push.store_gate import (
    MAGIC,
    MAX_MEMBER_CONNECTIONS,
    MAX_UNPROVEN,
    NONCE_BYTES,
    StoreRefused,
    key_id,
)
from asyncrl.push.store_rights import Member, member_plan
from asyncrl.push.transfer import receive_weights, send_weights

NAMED = [("w", torch.arange(12, dtype=torch.float32).reshape(3, 4)), ("b", torch.ones(5))]


def plan_of(store, push_id: str = "push-gated") -> PushPlan:
    return PushPlan(push_id=push_id, version=1, store_address=f"127.0.0.1:{store.port}", store_key=store.key,
                    world_size=2, transport="gloo", tensors=tensor_metas(NAMED), bucket_bytes=1 << 20,
                    timeout_s=20)


def push_once(store, plan: PushPlan) -> dict:
    """One push, sender here, receiver on a thread: what the receiver got."""
    got = {}

    def receive():
        group = make_group(plan, 1)
        for bucket in receive_weights(group, plan):
            got.update({name: t.clone() for name, t in bucket})
        group.close()

    thread = threading.Thread(target=receive)
    thread.start()
    group = make_group(plan, 0, store, join_timeout_s=10)
    send_weights(group, NAMED, plan)
    group.close()
    thread.join(30)
    return got


def test_a_caller_without_the_key_gets_no_command_through():
    store = host_store("127.0.0.1", 0, 10)
    store.set("push/secret", b"kept")
    # torch's own client at the gate: the gate hangs up on its first bytes.
    with pytest.raises(DistError):
        outsider = TCPStore("127.0.0.1", store.port, is_master=False, timeout=datetime.timedelta(seconds=3))
        outsider.set("push/secret", b"overwritten")
    assert store.get("push/secret") == b"kept"
    # The key of another store: refused, saying so.
    started = time.monotonic()
    with pytest.raises(StoreRefused, match="does not hold this plan's store_key"):
        gated_client(f"127.0.0.1:{store.port}", bytes(32), 5)
    assert time.monotonic() - started < 2
    member = gated_client(f"127.0.0.1:{store.port}", store.key, 5)
    assert member.get("push/secret") == b"kept"


def test_a_proof_is_good_once():
    """The member's proof covers the gate's fresh nonce: sent again on a new connection, it is refused."""
    store = host_store("127.0.0.1", 0, 10)
    client_nonce = os.urandom(NONCE_BYTES)

    def attempt(proof_for=None):
        with socket.create_connection(("127.0.0.1", store.port), timeout=5) as sock:
            sock.sendall(MAGIC + client_nonce + key_id(store.key) + bytes(2))
            gate_nonce = sock.recv(1 + NONCE_BYTES + 32, socket.MSG_WAITALL)[1:1 + NONCE_BYTES]
            nonce = proof_for or gate_nonce
            sock.sendall(hmac.new(store.key, b"member\n" + client_nonce + nonce, hashlib.sha256).digest())
            return gate_nonce, sock.recv(1)

    first_nonce, accepted = attempt()
    assert accepted == b"\x01"
    _, replayed = attempt(proof_for=first_nonce)  # the recorded proof, on a connection with a new gate nonce
    assert replayed == b""


def test_a_forged_verdict_never_reaches_the_push():
    """The attack that used to stop training: one key written under a push's prefix (its verdict) made the
    receivers call the push off. Through the gate it is refused, and the push goes through."""
    store = host_store("127.0.0.1", 0, 10)
    plan = plan_of(store)
    with socket.create_connection(("127.0.0.1", store.port), timeout=5) as sock:
        # What torch's client would send to set "push/<id>/verdict": the gate reads a bad greeting and hangs up.
        sock.sendall(b"\x02" + b"/push/push-gated/verdict" + b"abort: forged" * 100)
        assert sock.recv(1) == b""
    assert not push_store(store, plan).check(["verdict"])
    got = push_once(store, plan)
    assert all(torch.equal(got[name], tensor) for name, tensor in NAMED)


def test_a_flood_of_connections_and_bytes_costs_the_learner_a_few_mb_and_members_still_push():
    """8 callers send 64 MiB each, 200 connect and say nothing: the gate reads 37 bytes of each, holds at most
    MAX_UNPROVEN silent ones (each for HANDSHAKE_S), and a member's push goes through meanwhile."""
    store = host_store("127.0.0.1", 0, 10)
    process = psutil.Process()
    before = process.memory_info().rss
    silent = []
    for _ in range(200):
        try:
            silent.append(socket.create_connection(("127.0.0.1", store.port), timeout=5))
        except OSError:
            break
    junk = os.urandom(1 << 20)

    def flood():
        try:
            with socket.create_connection(("127.0.0.1", store.port), timeout=5) as sock:
                for _ in range(64):
                    sock.sendall(junk)
        except OSError:
            pass  # the gate hung up: what it should do

    floods = [threading.Thread(target=flood) for _ in range(8)]
    for thread in floods:
        thread.start()
    got = push_once(store, plan_of(store, "push-during-flood"))
    for thread in floods:
        thread.join(30)
    assert all(torch.equal(got[name], tensor) for name, tensor in NAMED)
    assert store.gate.refused >= 8 + len(silent) - MAX_UNPROVEN
    grew_mb = (process.memory_info().rss - before) / 2**20
    assert grew_mb < 64, grew_mb
    for sock in silent:
        sock.close()


def test_a_closed_gate_refuses_at_once_even_while_its_thread_is_busy():
    """A store dropped by its learner stops listening before `close` returns: a late member's connect is refused
    (`SenderGone` at once) rather than accepted by the kernel and reset mid-handshake a moment later."""
    store = host_store("127.0.0.1", 0, 10)
    gate, port = store.gate, store.port
    gate._loop.loop.call_soon_threadsafe(time.sleep, 0.5)  # the gate's thread is busy for a moment
    started = time.monotonic()
    del store
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
    assert time.monotonic() - started >= 0.3  # close waited for the gate's thread to stop listening
    assert gate._server.sockets == ()


def member_of(store, plan: PushPlan, rank: int, claimed_rank: int | None = None):
    """A receiver's connection with the member key its order carries (`store_rights.member_plan`)."""
    ordered = member_plan(plan, rank)
    return gated_client(ordered.store_address, ordered.store_key, 5, Member(plan.group_key, claimed_rank or rank))


def test_a_member_writes_only_its_own_ranks_keys_and_the_push_goes_through():
    """A token holder who registered a replica gets a member key in its signed order. With it, it once could
    forge a verdict, mark another rank ready or write large values into the learner; now each such command
    hangs up on it before the store sees it, and the push of the honest members goes through."""
    store = host_store("127.0.0.1", 0, 10)
    plan = dataclasses.replace(plan_of(store, "push-members"), world_size=3, group_id="g1")
    open_push(store, plan)
    push_store(member_of(store, plan, 1), plan).set("ready/1", b"ok")  # its own key: through
    assert push_store(store, plan).get("ready/1") == b"ok"
    keys_before = store.num_keys()
    attacks = {
        "a forged verdict": lambda s: push_store(s, plan).set("verdict", "abort: forged"),
        "another rank's ready key": lambda s: push_store(s, plan).set("ready/2", b"ok"),
        "a value of 1 MiB": lambda s: push_store(s, plan).set("ack/1", bytes(1 << 20)),
        "a delete": lambda s: s.delete_key("current_push"),
        "the next push's order": lambda s: s.set("order/g1/after/push-members", b"\x00" * 100),
        "another group's gloo key": lambda s: s.set("group/g2//0/1", b"address"),
    }
    for what, attack in attacks.items():
        member = member_of(store, plan, 1)
        with pytest.raises(DistError):
            attack(member)
            member.get("ready/1")  # a set is not answered: the next command finds the connection closed
        assert store.gate.refused_commands >= 1, what
    assert store.gate.refused_commands == len(attacks)
    assert not push_store(store, plan).check(["verdict"]) and not push_store(store, plan).check(["ready/2"])
    assert store.num_keys() == keys_before  # nothing reached the store (a value over its bound is refused
    # as soon as its length is read: `tests/unit/test_store_rights.py`)
    # The key of rank 1 does not prove rank 2, nor the group of another push.
    with pytest.raises(StoreRefused, match="does not hold this plan's store_key"):
        member_of(store, plan, 1, claimed_rank=2)
    # The honest members (ranks 1 and 2, each with its own key) receive a push, rank 1 writing ready again.
    got = {}

    def receive(rank):
        ordered = member_plan(plan, rank)
        group = make_group(ordered, rank)
        got[rank] = {name: t.clone() for bucket in receive_weights(group, ordered) for name, t in bucket}
        group.close()

    receivers = [threading.Thread(target=receive, args=(rank,)) for rank in (1, 2)]
    for thread in receivers:
        thread.start()
    send_weights(make_group(plan, 0, store, join_timeout_s=10), NAMED, plan)
    for thread in receivers:
        thread.join(30)
    for rank in (1, 2):
        assert all(torch.equal(got[rank][name], tensor) for name, tensor in NAMED), rank


def test_a_members_write_into_a_push_not_opened_yet_waits_for_it():
    """Receivers can hear of a push (the controller's order) before the learner opens it at its gate: the
    member's ready key is held until the push opens, then reaches the store."""
    store = host_store("127.0.0.1", 0, 10)
    plan = dataclasses.replace(plan_of(store, "push-later"), world_size=2, group_id="g1")
    member = push_store(member_of(store, plan, 1), plan)
    wrote = threading.Thread(target=member.set, args=("ready/1", b"ok"))
    wrote.start()
    time.sleep(0.5)
    assert not push_store(store, plan).check(["ready/1"])
    open_push(store, plan)
    push_store(store, plan).wait(["ready/1"], datetime.timedelta(seconds=5))
    wrote.join(5)
    assert push_store(store, plan).get("ready/1") == b"ok" and store.gate.refused_commands == 0


def test_a_member_key_holds_a_bounded_number_of_connections():
    """However many connections a member opens with its key, the gate holds at most MAX_MEMBER_CONNECTIONS of
    them (the learner holds a bounded buffer for each); another member is not affected, and one connection
    closed makes room again."""
    store = host_store("127.0.0.1", 0, 10)
    plan = dataclasses.replace(plan_of(store, "push-conns"), world_size=3, group_id="g1")
    held = [member_of(store, plan, 1) for _ in range(MAX_MEMBER_CONNECTIONS)]
    with pytest.raises(StoreRefused, match="refused this plan's store_key"):
        member_of(store, plan, 1)
    assert member_of(store, plan, 2).check(["current_push"]) is False
    del held[0]  # its client closes, and so does its pipe through the gate
    gc.collect()
    deadline = time.monotonic() + 5
    while True:
        try:
            member_of(store, plan, 1)
            break
        except StoreRefused:
            assert time.monotonic() < deadline, "the closed connection never made room"
            time.sleep(0.1)
