"""In-band push orders: a push on a kept broadcast group reaches its members through the learner's store, not
through the controller.

Beyond its bytes, a push costs the hops around them. Ordered by the controller, a push is four gRPC hops
(Begin; `Rollout.UpdateWeights` to every receiver, answered once its weights are in; Commit, which waits for
those answers) and a thread per receiver in the controller. Ordered in-band, it is one:

    learner     (with the previous push's CommitWeightPush(reserve_next)) <- controller: the plan, each rank's
                order MAC, the group's last push
    learner     order/<group>/after/<last push> := PushOrder           (in its own store)
    member      (waiting on that key since it took the last push) checks its rank's MAC, joins the push: the
                usual join handshake, so a dead or paused member is still found before the broadcast
    learner     broadcast
    member      receive, load; ack/<rank> := PushAck in the push's store (`transport.push_store`, keys
                push/<push id>//ack/<rank> of the root), signed under its push key
    learner     waits (bounded) for every rank's ack, CommitWeightPush(acks) -> controller checks each signature

The controller decides per push (`push.coordinator`): in-band only for the push it reserves at a commit, for a
learner that offers it, on a group every member acknowledged and every member registered as following.
Forming a group, a membership change, a resync and any failure take the controller's path. The messages are `PushOrder` and
`PushAck` in `weights.proto`. No controller call fails for a member whose process is gone, so the learner
dials the members that do not join or do not ack (`push.rendezvous.sender_join`, `collect_acks`: `gone`).
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Callable

from google.protobuf.message import DecodeError
from torch.distributed import DistStoreError

from asyncrl.core.checks.validation import InvalidArgument, require
from asyncrl.push.plan import PushPlan
from asyncrl.push.store_rights import UNSENT_KEY
from asyncrl.v1 import weights_pb2

ORDER_KEY = "order/{group_id}/after/{push_id}"
"""In the sender's root store: the order of the push after `push_id` on the group."""
ACK_KEY = "ack/{rank}"
"""In the push's own store (`transport.push_store`): a member's `PushAck`."""
MAX_ORDER_BYTES = 1 << 20
WAKE = b"wake"
"""Written at an order key that holds no order, to end its members' wait at once: a member that took a push
ordered by the controller waits on another key from then on (`wake_waiters`). No order reaches that key any
more: the sender deletes it at its next commit (`WeightPublisher`)."""


def order_key(group_id: str, after_push_id: str) -> str:
    return ORDER_KEY.format(group_id=group_id, push_id=after_push_id)


def publish_order(root, group_id: str, after_push_id: str, plan: PushPlan, order_macs: list[bytes]) -> str:
    """Sender: put the order for the push after `after_push_id` where the group's members wait; returns its
    key (the sender deletes it when it writes the next one, or at the commit after a push the controller
    ordered)."""
    key = order_key(group_id, after_push_id)
    published = dataclasses.replace(plan, store_key=UNSENT_KEY)  # every member reads it: no key in it
    root.set(key, weights_pb2.PushOrder(plan=published.to_proto(), order_macs=order_macs).SerializeToString())
    return key


def wait_for_order(root, key: str, poll_s: float, keep_waiting: Callable[[], bool],
                   refused: bytes = b"") -> bytes | None:
    """Member: the order at `key` once it is there (and is not `refused`, an order this member already turned
    down, which the sender's own order overwrites, nor `WAKE`); None as soon as `keep_waiting()` (asked every
    `poll_s`, and whenever the key is woken) says to stop. A store that went away (the learner is gone) raises."""
    while keep_waiting():
        try:
            root.wait([key], datetime.timedelta(seconds=poll_s))
        except DistStoreError:  # a time-out: ask again
            continue
        data = root.get(key)
        if data not in (refused, WAKE):
            return data
        if not keep_waiting():  # woken because the member moved on
            return None
        time.sleep(poll_s)  # the key holds what this member turned down: look again for a replacement
    return None


def wake_waiters(root, key: str) -> None:
    """End the wait of everyone waiting at `key` now, unless an order is there already (a compare-and-set
    on an absent key)."""
    root.compare_set(key, "", WAKE)


def parse_order(data: bytes, rank: int) -> tuple[PushPlan, bytes]:
    """An order's plan and the MAC for `rank`; InvalidArgument naming the field when it does not parse."""
    require(len(data) <= MAX_ORDER_BYTES, "order", f"at most {MAX_ORDER_BYTES} bytes, got {len(data)}")
    order = weights_pb2.PushOrder()
    try:
        order.ParseFromString(data)
    except DecodeError as err:
        raise InvalidArgument("order", f"not a PushOrder: {err}") from None
    require(order.HasField("plan"), "order.plan", "is required")
    plan = PushPlan.from_proto(order.plan, "order.plan")
    require(1 <= rank < plan.world_size, "order.plan.world_size", f"has no rank {rank}")
    require(len(order.order_macs) == plan.world_size - 1, "order.order_macs",
            f"must hold one MAC per receiver ({plan.world_size - 1}), got {len(order.order_macs)}")
    return plan, order.order_macs[rank - 1]


def write_ack(handshake, rank: int, weight_version: int, ack_mac: bytes = b"", error: str = "",
              adapter_checksum: str = "") -> None:  # fmt: skip
    """Member: its answer to the push whose store is `handshake` (with the adapter it serves, after an adapter
    push)."""
    ack = weights_pb2.PushAck(rank=rank, weight_version=weight_version, ack_mac=ack_mac, error=error,
                              adapter_checksum=adapter_checksum)
    handshake.set(ACK_KEY.format(rank=rank), ack.SerializeToString())


def collect_acks(handshake, world_size: int, timeout_s: float, gone: Callable[[int], bool] | None = None,
                 check_every_s: float = 1.0) -> list[weights_pb2.PushAck]:
    """Sender: every receiver's ack, waiting up to `timeout_s` for them all; a rank still silent then has
    none in the list (the controller drops it), one whose ack does not parse gets an ack with an error.
    `gone(rank)`: asked every `check_every_s` of the ranks still silent; one whose process is gone is not
    waited for any longer (it died while loading)."""
    keys = {rank: ACK_KEY.format(rank=rank) for rank in range(1, world_size)}
    silent, given_up = dict(keys), set()
    deadline = time.monotonic() + timeout_s
    while silent:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            slice_s = min(remaining, check_every_s) if gone is not None else remaining
            handshake.wait(list(silent.values()), datetime.timedelta(seconds=slice_s))
            silent = {}
        except DistStoreError:
            silent = {rank: key for rank, key in silent.items() if not handshake.check([key])}
            given_up |= {rank for rank in silent if gone is not None and gone(rank)}
            silent = {rank: key for rank, key in silent.items() if rank not in given_up}
    present = [(rank, key) for rank, key in keys.items() if rank not in silent and rank not in given_up]
    values = handshake.multi_get([key for _, key in present]) if present else []
    acks = []
    for (rank, _), value in zip(present, values):
        ack = weights_pb2.PushAck()
        try:
            ack.ParseFromString(value)
        except DecodeError:
            ack = weights_pb2.PushAck(error="its ack does not parse")
        if ack.rank != rank:  # a value under another rank's key says nothing about this one
            ack = weights_pb2.PushAck(error=f"its ack names rank {ack.rank}")
        ack.rank = rank
        acks.append(ack)
    return acks


def forget_acks(handshake, world_size: int) -> None:
    """Sender: delete a finished push's ack keys (with its handshake keys, during the next push)."""
    for rank in range(1, world_size):
        handshake.delete_key(ACK_KEY.format(rank=rank))
