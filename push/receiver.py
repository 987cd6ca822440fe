"""The replica's side of the push: `PushReceiver` takes a push ordered by the controller (UpdateWeights) or
in-band (found in the learner's store by its `PushListener`): the order's signature checked under the
replica's push key, the manifest resolved, the engine's own update called (it joins the broadcast and loads).

`PushListener` follows the broadcast group the replica kept: after each push on a kept group it waits in the
learner's store for the order of the next one (`push.in_band`), takes it as an UpdateWeights call from the
controller would be taken (the same signature check, the same engine call), and acknowledges it there.

One thread, started at the first push it follows. Every push this replica takes on a kept group, ordered by
the controller or in-band, moves it on to wait for the push after that one; a push on another group replaces
what it follows; a failure stops following (the controller then forms a new group, through UpdateWeights).

Only the push's members get through the store's gate (`push.store_gate`), each with a key of its own that
writes only its own rank's keys (`push.store_rights`); an order found there still counts only when the
controller signed it for this replica's rank (with the member key this replica holds for the group in place
of the none the published plan carries). One that is not signed is refused, and the listener waits on for
the sender's own order to replace it.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import threading
from collections.abc import Callable

from torch.distributed import DistError, TCPStore

from asyncrl.core.checks.validation import InvalidArgument
from asyncrl.core.wire.auth import push_ack_mac, push_order_mac
from asyncrl.core.wire.push_contract import WeightUpdateStats
from asyncrl.push.broadcast import push_store, store_client
from asyncrl.push.groups import ManifestCache
from asyncrl.push.in_band import order_key, parse_order, wait_for_order, wake_waiters, write_ack
from asyncrl.push.plan import PushPlan
from asyncrl.push.rendezvous import POLL_S, PushAborted
from asyncrl.push.store_gate import SenderGone
from asyncrl.push.store_rights import Member

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Followed:
    """The group a replica follows, its rank there and the last push it took on it."""

    store: tuple[str, bytes]
    """The learner's store: its address and this replica's member key for the group (`PushPlan.store`)."""
    group_id: str
    group_key: str
    rank: int
    after_push_id: str
    timeout_s: float

    @property
    def key(self) -> str:
        return order_key(self.group_id, self.after_push_id)

    @property
    def member(self) -> Member:
        return Member(self.group_key, self.rank)


class PushListener:
    def __init__(self, take: Callable[[PushPlan, int], WeightUpdateStats], push_key: Callable[[], bytes],
                 on_refused: Callable[[], None], poll_s: float = POLL_S):  # fmt: skip
        self._take = take
        """(plan, rank) -> stats: the replica's own handling of a push (the engine's update, metrics)."""
        self._push_key = push_key
        self._on_refused = on_refused
        self._poll_s = poll_s
        self._followed: Followed | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._store: tuple[tuple[str, bytes], TCPStore, str] | None = None
        """((address, key), client, the group it was made for) of the learner's store: this thread's own
        connection."""
        self._refused: tuple[Followed, bytes] | None = None
        """The last order refused, and where: not looked at again until something replaces it."""
        self._waiting_on: Followed | None = None
        """What the thread is blocked on in the store (None while it is not)."""
        self.taken = 0
        """In-band pushes taken."""

    def follow(self, plan: PushPlan, rank: int) -> None:
        """This replica took `plan` as `rank`: wait for the order of the push after it (if it keeps a group)."""
        if not plan.group_id:
            return self.forget()
        with self._cond:
            self._followed = Followed(plan.store, plan.group_id, plan.group_key, rank, plan.push_id, plan.timeout_s)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="push-listener", daemon=True)
                self._thread.start()
            self._cond.notify_all()
            stale = self._waiting_on if self._waiting_on != self._followed else None
        if stale is not None:
            # The thread is blocked on the key of the push before this one (this push came through
            # UpdateWeights): wake it, or the next in-band order would wait for its poll to end (`poll_s`).
            threading.Thread(target=self._wake, args=(stale,), name="push-listener-wake", daemon=True).start()

    def forget(self) -> None:
        """Stop following (a push failed here: the controller forms a new group)."""
        with self._cond:
            self._followed = None

    def close(self) -> None:
        with self._cond:
            self._closed, self._followed = True, None
            self._cond.notify_all()

    @property
    def followed(self) -> Followed | None:
        with self._cond:
            return self._followed

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._followed is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                target = self._followed
            refused = self._refused[1] if self._refused is not None and self._refused[0] == target else b""
            try:
                root = self._root(target)
                with self._cond:
                    self._waiting_on = target
                try:
                    data = wait_for_order(root, target.key, self._poll_s, lambda t=target: self.followed == t,
                                          refused)
                finally:
                    with self._cond:
                        self._waiting_on = None
                if data is not None and self.followed == target:  # not if it moved on (or closed) meanwhile
                    self._answer(target, root, data)
            except (DistError, SenderGone) as err:  # the learner's store went away (a new learner forms a new group)
                stale = self._store is not None and self._store[2] != target.group_id
                self._store = None
                if stale and not isinstance(err, SenderGone):
                    # A connection kept from an earlier group, to a learner since restarted at the same address:
                    # this group's learner is the new one. Once more, over a connection of its own.
                    log.info("reconnecting to %s for group %s (%s)", target.store[0], target.group_id, err)
                    continue
                log.info("stopped following group %s: its store is gone (%s)", target.group_id, err)
                self._forget_if(target)
            except Exception:  # this thread must outlive any one order: it serves every later push
                log.exception("stopped following group %s", target.group_id)
                self._store = None
                self._forget_if(target)

    def _root(self, target: Followed) -> TCPStore:
        """The connection to `target`'s store: the one kept, when it goes to the same store."""
        if self._store is None or self._store[0] != target.store:
            client = store_client(*target.store, min(target.timeout_s, 30.0), target.member)
            self._store = (target.store, client, target.group_id)
        return self._store[1]

    @staticmethod
    def _wake(target: Followed) -> None:
        """Wake whoever waits at `target`'s key, over a connection of its own (best effort: a store that is gone
        ends that wait by itself)."""
        try:
            wake_waiters(store_client(*target.store, 2.0, target.member), target.key)
        except (DistError, SenderGone) as err:
            log.info("could not wake the wait at %s: %s", target.key, err)

    def _forget_if(self, target: Followed) -> None:
        with self._cond:
            if self._followed == target:
                self._followed = None

    def _answer(self, target: Followed, root: TCPStore, data: bytes) -> None:
        """Take the order `data` found at `target.key`, if its controller signed it for this replica's rank,
        and write the ack; an order nobody signed is refused and not acked."""
        rank, key = target.rank, self._push_key()
        try:
            plan, mac = parse_order(data, rank)
        except InvalidArgument as err:
            return self._refuse(target, data, f"an order that does not parse ({err})")
        plan = dataclasses.replace(plan, store_key=target.store[1])  # its own key: what the controller signed
        if not key or not hmac.compare_digest(mac, push_order_mac(key, plan, rank)):
            return self._refuse(target, data, "an order its controller did not sign")
        if plan.group_id != target.group_id or plan.new_group:
            return self._refuse(target, data, f"an order for another group ({plan.group_id!r})")
        # An order read late (this replica was paused) is for a push long over: its join gives up as soon as the
        # sender announces another push, as for a late UpdateWeights (`rendezvous.receiver_join`).
        handshake = push_store(root, plan)
        try:
            stats = self._take(plan, rank)
        except PushAborted as err:  # the sender called it off: it knows, and the next push forms a new group
            log.warning("in-band push %s not taken: %s", plan.push_id, err)
            return self._forget_if(target)
        except Exception as err:  # reported in the ack; the controller resyncs this replica
            log.exception("in-band push %s failed", plan.push_id)
            write_ack(handshake, rank, 0, error=f"{type(err).__name__}: {err}"[:1000])
            return self._forget_if(target)
        checksum = stats.adapter_checksum
        self.taken += 1  # before the ack: whoever the ack wakes sees the count
        write_ack(handshake, rank, stats.version, push_ack_mac(key, plan.push_id, rank, stats.version, checksum),
                  adapter_checksum=checksum)
        with self._cond:
            if self._followed == target:
                self._followed = dataclasses.replace(target, after_push_id=plan.push_id)

    def _refuse(self, target: Followed, data: bytes, what: str) -> None:
        log.warning("refused %s at %s", what, target.key)
        self._on_refused()
        self._refused = (target, data)


class OrderNotSigned(PermissionError):
    """An UpdateWeights order this replica's controller did not sign (PERMISSION_DENIED)."""


class PushReceiver:
    """One replica's intake of pushes. `load(plan, rank)` is the engine's own update (join the broadcast as
    `rank`, load the weights; returns `WeightUpdateStats`); `push_key()` the key the controller signs this
    replica's orders with, or None for a replica without a controller (tests, tools), which checks no
    signature and follows no group."""

    def __init__(self, load: Callable[[PushPlan, int], WeightUpdateStats], push_key: Callable[[], bytes] | None,
                 on_refused: Callable[[], None]):  # fmt: skip
        self._load, self._push_key, self._on_refused = load, push_key, on_refused
        self.manifests = ManifestCache()
        """Tensor manifests of plans that name one by digest, read once from the learner's store."""
        self.listener = None if push_key is None else PushListener(self.take, push_key, on_refused)
        """Follows the broadcast group this replica keeps, for in-band pushes (only with a controller)."""

    def take(self, plan: PushPlan, rank: int) -> WeightUpdateStats:
        """Join `plan`'s push as `rank` and load the weights (an order already checked)."""
        return self._load(self.manifests.resolve(plan, rank), rank)

    def take_ordered(self, plan: PushPlan, rank: int, order_mac: bytes) -> WeightUpdateStats:
        """An order from the controller (UpdateWeights): refused unless signed for this replica's rank; once
        taken, the listener waits for the next push on its group; a failure stops following (the controller
        forms a new group). Raises what the load raised: `ValueError` when the plan does not fit the model,
        `PushAborted` when the sender called it off."""
        if self._push_key is not None:
            key = self._push_key()
            if not key or not hmac.compare_digest(order_mac, push_order_mac(key, plan, rank)):
                self._on_refused()
                raise OrderNotSigned("order_mac: this push was not ordered by this replica's controller")
        try:
            stats = self.take(plan, rank)
        except Exception:
            if self.listener is not None:
                self.listener.forget()
            raise
        if self.listener is not None:
            self.listener.follow(plan, rank)
        return stats

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
