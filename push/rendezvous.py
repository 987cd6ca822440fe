"""The join handshake in front of every push's broadcast.

Forming a gloo/nccl group, or entering a broadcast on a group formed earlier, blocks every member until all
`world_size` ranks arrive, for up to the push's time-out. One receiver that died after the controller picked
it (its process is gone, its heartbeat not yet stale) would hold the learner and every healthy receiver for
that long. So before each push's broadcast:

- each receiver writes `ready/<rank>` into the push's store: `ok`, or `no-group` when the plan reuses a
  broadcast group this process is not a member of (it restarted, or dropped the group after a failure);
- the controller writes `unreachable` in place of a receiver it could not even reach with the push's order
  (nothing listens at its address: the process is gone), so the sender need not wait for it; for an
  in-band push (`push.in_band`: no order call to fail) the sender dials the receivers still missing after
  `GONE_AFTER_S` and writes it itself for those where nothing listens;
- the sender waits up to `join_timeout_s` for all ready keys, then writes the verdict: `go` (everybody
  broadcasts) or `abort` (nobody does: receivers raise `PushAborted` at once, the sender raises
  `ReceiversMissing` naming the absent or group-less ranks, and the controller forms a new group for the
  next attempt).

Keys live under the push's own prefix, so pushes never see each other's keys. Waiting is the store's own
blocking wait (answered the moment the key is written): the handshake costs a few store round trips, well
under a millisecond on one host.

An order can reach a receiver late: a replica that was paused or hung (SIGSTOP, swapping, a stalled GPU)
works through the UpdateWeights calls that queued up meanwhile when it resumes, for pushes long over, whose
keys the sender has deleted. Waiting for such a push's verdict would hold the replica for the push's whole
time-out per stale order, and make it miss every push in between. So the sender also writes which push it
is on (`current_push`, in the store's root), and a waiting receiver looks at it every `POLL_S`: once it
moves to a push other than its own, its push is over (the sender begins the next only after finishing it,
and it could not have finished without this receiver) and it gives up at once.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable

from torch.distributed import DistNetworkError, DistStoreError

READY, NO_GROUP, UNREACHABLE = b"ok", b"no-group", b"unreachable"
CURRENT_PUSH = "current_push"
CHECKSUM = "checksum"
"""In a push's store: the SHA-256 of what the sender sent (`WeightPushPlan.checksum_in_store`)."""
POLL_S = 0.25
"""How often a receiver waiting for its verdict checks that its push is still the sender's."""
GONE_AFTER_S = 0.25
"""How long the sender waits for the receivers before asking whether the missing ones are gone at all."""


class PushAborted(RuntimeError):
    """The sender called the push off before the broadcast (some receiver never showed up)."""


class SenderLost(PushAborted):
    """The sender's store went away while a receiver waited for this push's verdict: the sender process is gone,
    and its push with it (a restarted sender, even at the same address, never runs it)."""


class ReceiversMissing(RuntimeError):
    """Some receivers did not join within the join time-out (`absent`), or joined but lack the reused group;
    `ranks` lists them."""

    def __init__(self, push_id: str, ranks: list[int], join_timeout_s: float, reason: str = "",
                 absent: bool = True):
        reason = reason or f"did not join within {join_timeout_s:g} s"
        super().__init__(f"push {push_id}: receivers of rank {ranks} {reason}")
        self.ranks = ranks
        self.absent = absent


def _ready_key(rank: int) -> str:
    return f"ready/{rank}"


def _ready_keys(world_size: int) -> list[str]:
    return [_ready_key(rank) for rank in range(1, world_size)]


def sender_join(store, push_id: str, world_size: int, join_timeout_s: float,
                gone: Callable[[int], bool] | None = None) -> None:
    """Rank 0: wait for every receiver's ready key, then tell them all to go (or abort and raise). `gone(rank)`:
    whether that receiver's process is known to be gone; asked, after `GONE_AFTER_S`, of the ranks not there
    yet, when nobody else will say so (an in-band push: no controller call fails for them)."""
    keys = _ready_keys(world_size)
    if not keys:
        return
    waited = 0.0
    if gone is not None and join_timeout_s > GONE_AFTER_S:
        waited = GONE_AFTER_S
        try:
            store.wait(keys, datetime.timedelta(seconds=GONE_AFTER_S))
        except DistStoreError:
            for rank, key in enumerate(keys, start=1):
                if not store.check([key]) and gone(rank):
                    mark_unreachable(store, rank)
    try:
        store.wait(keys, datetime.timedelta(seconds=join_timeout_s - waited))
    except DistStoreError:
        missing = [rank for rank, key in enumerate(keys, start=1) if not store.check([key])]
        store.set("verdict", f"abort: ranks {missing} did not join")
        raise ReceiversMissing(push_id, missing, join_timeout_s) from None
    states = store.multi_get(keys)
    gone = [rank for rank, state in enumerate(states, start=1) if state == UNREACHABLE]
    if gone:
        store.set("verdict", f"abort: ranks {gone} could not be reached")
        raise ReceiversMissing(push_id, gone, join_timeout_s, "could not be reached (nothing listens at their address)")
    groupless = [rank for rank, state in enumerate(states, start=1) if state != READY]
    if groupless:
        store.set("verdict", f"abort: ranks {groupless} are not members of the push's group")
        raise ReceiversMissing(push_id, groupless, join_timeout_s,
                               "are not members of the reused group", absent=False)
    store.set("verdict", "go")


def mark_unreachable(store, rank: int) -> None:
    """The controller, for a receiver its order could not reach: `unreachable` as the rank's ready key in the
    push's store, unless the receiver wrote its own (a compare-and-set on an absent key)."""
    store.compare_set(_ready_key(rank), "", UNREACHABLE)


def announce(root, push_id: str) -> None:
    """Rank 0, before the handshake of `push_id`: this is the push the sender is on (in the store's root)."""
    root.set(CURRENT_PUSH, push_id)


def current_push(root) -> str:
    """The push the sender last announced ("" before any). One round trip: a compare-and-set that changes
    nothing when the key is there and leaves it empty when it is not (a check and a get cost four times as
    much, on every receiver of every push)."""
    return root.compare_set(CURRENT_PUSH, "", "").decode()


def receiver_join(store, push_id: str, rank: int, timeout_s: float, has_group: bool = True,
                  root=None) -> None:
    """Rank > 0: announce this rank (and whether it holds the group the plan reuses), wait for the sender's
    verdict; raise PushAborted on abort, and (with `root`, the store the sender announces its pushes in) as
    soon as the sender has moved on to another push."""
    store.set(_ready_key(rank), READY if has_group else NO_GROUP)
    deadline = time.monotonic() + timeout_s
    poll_s = POLL_S if root is not None else timeout_s
    seen = current_push(root) if root is not None else ""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PushAborted(f"push {push_id}: no verdict from the sender within {timeout_s:g} s")
        try:
            store.wait(["verdict"], datetime.timedelta(seconds=min(poll_s, remaining)))
            break
        except DistNetworkError as err:
            raise SenderLost(f"push {push_id}: the sender's store went away while waiting for its verdict "
                             f"({err})") from None
        except DistStoreError:
            if root is None:
                continue  # the deadline has passed: raised above
            try:
                now = current_push(root)
            except DistNetworkError as err:
                raise SenderLost(f"push {push_id}: the sender's store went away ({err})") from None
            # Before the sender reaches this push, it may announce it (seen -> push_id); any other move means
            # this push is over. A late order finds another push announced and waits for the next move.
            if now != seen and now != push_id:
                raise PushAborted(f"push {push_id} is over: the sender has moved on to {now} (this order came "
                                  "late)") from None
            seen = now
    verdict = store.get("verdict").decode()
    if verdict != "go":
        raise PushAborted(f"push {push_id} called off by the sender ({verdict})")


def publish_checksum(store, checksum: str) -> None:
    """Rank 0, once its broadcast is over: the checksum of what it sent, under the push's `CHECKSUM` key (no
    member may write there: `push.store_rights`)."""
    store.set(CHECKSUM, checksum)


def sent_checksum(store, push_id: str, timeout_s: float) -> str:
    """Rank > 0: the checksum the sender wrote for `push_id`, waiting up to `timeout_s` for it."""
    try:
        store.wait([CHECKSUM], datetime.timedelta(seconds=timeout_s))
    except DistNetworkError as err:
        raise SenderLost(f"push {push_id}: the sender's store went away before its checksum ({err})") from None
    except DistStoreError:
        raise PushAborted(f"push {push_id}: the sender wrote no checksum within {timeout_s:g} s") from None
    return store.get(CHECKSUM).decode()


def forget(store, world_size: int) -> None:
    """Delete a push's handshake keys, so the learner's store does not grow with every push. Only once every
    receiver answered (`push.groups` does it once the next push's broadcast is over): the sender's broadcast
    can end before a slow receiver has read the verdict."""
    for key in [*_ready_keys(world_size), "verdict", CHECKSUM]:
        store.delete_key(key)
