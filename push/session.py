"""One weight push in the controller's hands (`PushSession`): its plan, its receivers in rank order, and their
outcomes, from the fan-out (one thread per receiver calls the injected `WeightNotifier`: in production
`Rollout.UpdateWeights` through `push.fanout`) or, for an in-band push, from the acks the learner relays
(`outcomes_from_acks`, each checked under the replica's push key). `push.coordinator` opens, reserves,
commits and aborts them."""

from __future__ import annotations

import dataclasses
import hmac
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from asyncrl.core.wire.auth import push_ack_mac, push_order_mac
from asyncrl.push.plan import PushOffer, PushPlan
from asyncrl.push.protocol import Route
from asyncrl.push.store_rights import member_plan


@dataclass(frozen=True)
class ReceiverAnswer:
    """A receiver's answer to a push the controller ordered (`UpdateWeightsResponse`)."""

    weight_version: int
    """The version it holds now."""
    adapter_checksum: str = ""
    """The checksum of the adapter it serves ("" for full weights)."""


WeightNotifier = Callable[[str, PushPlan, int, float, bytes], ReceiverAnswer]
"""(address, plan, rank, timeout_s, order_mac) -> the replica's answer; raises on failure (a
`ReceiverUnreachable` when nothing listens at the address any more)."""


class ReceiverUnreachable(RuntimeError):
    """A notifier's failure meaning the replica's process is gone (nothing listens at its address): the
    controller declares it dead at once instead of waiting for its heartbeat time-out."""


@dataclass(frozen=True)
class Membership:
    """Who is in a broadcast group, in rank order, and where it forms: a push to the same members reuses the
    group. The push keys are in it because a replica that registered again is a new process (new key) that
    does not hold the group its predecessor joined."""

    group_id: str
    members: tuple[tuple[str, str, bytes], ...]
    """(replica id, address, push key) of ranks 1..N."""
    store: tuple[str, bytes]
    """The learner's store (address, key): a learner restarted at the same address has a new key, and none
    of the old groups."""
    transport: str

    def same(self, other: Membership) -> bool:
        return (self.members, self.store, self.transport) == (other.members, other.store, other.transport)


@dataclass(frozen=True)
class Receiver:
    replica_id: str
    address: str
    rank: int
    push_key: bytes = b""


@dataclass(frozen=True)
class ReceiverAck:
    """A receiver's answer to an in-band push, as the learner relays it (`PushAck` in weights.proto)."""

    rank: int
    weight_version: int
    ack_mac: bytes
    error: str = ""
    adapter_checksum: str = ""
    """An adapter push: the checksum of the adapter the receiver serves (signed with the rest)."""


@dataclass(frozen=True)
class Outcome:
    ok: bool
    error: str
    seconds: float
    unreachable: bool = False
    """The replica could not be reached at all (its process is gone): treat it as dead right away."""
    adapter_checksum: str = ""
    """The checksum of the weights (adapter or full) the receiver says it received and serves."""


def judge_adapter(outcome: Outcome, pushed: str) -> Outcome:
    """A push took effect only where the receiver serves what the learner sent (`pushed`: the checksum of the
    adapter or of the full weights): a receiver that answers with another checksum, or none, failed the push
    (altered on the way, or never loaded). A commit that names no checksum is not judged."""
    if not pushed or not outcome.ok or outcome.adapter_checksum == pushed:
        return outcome
    served = outcome.adapter_checksum[:12] or "none"
    return dataclasses.replace(outcome, ok=False, error=f"serves weights checksum {served}, the learner pushed "
                                                        f"{pushed[:12]}: the push did not take effect as sent")


class PushSession:
    def __init__(self, *, plan: PushPlan, mode: str, receivers: list[Receiver], membership: Membership,
                 begun_at: float, notify: WeightNotifier, call_timeout_s: float, offer: PushOffer,
                 after_push_id: str = ""):  # fmt: skip
        self.plan, self.mode, self.receivers, self.begun_at = plan, mode, receivers, begun_at
        self.membership = membership
        """The broadcast group this push uses."""
        self.offer = offer
        """What the learner asked for in Begin (a reservation for the next push starts from it)."""
        self.after_push_id = after_push_id
        """Non-empty: an in-band push, reserved at the previous commit for its learner, which orders it through
        its store after this push of the group (no fan-out; the learner relays the acks). `begun_at` is that
        commit until the commit naming it re-dates it by the learner's own measure."""
        self.order_macs = [push_order_mac(r.push_key, member_plan(plan, r.rank), r.rank)
                           for r in receivers] if after_push_id else []  # fmt: skip
        """In-band: each rank's signed order, in rank order."""
        self._notify, self._call_timeout_s = notify, call_timeout_s
        self._done = threading.Condition()
        self._outcomes: dict[str, Outcome] = {}

    @property
    def push_id(self) -> str:
        return self.plan.push_id

    @property
    def route(self) -> Route:
        return Route.IN_BAND if self.after_push_id else Route.ORDERED

    @property
    def in_band(self) -> bool:
        return self.route is Route.IN_BAND

    def start(self) -> None:
        """Fan out: one daemon thread per receiver (every receiver must be in the collective at once; a hung
        replica must not keep the process alive), started from a thread of its own: starting a thousand
        threads takes tens of milliseconds, which must not be spent under the controller's lock. An in-band
        push has no fan-out: the learner orders it."""
        if self.in_band:
            return
        threading.Thread(target=self._fan_out, name=f"push-{self.plan.version}", daemon=True).start()

    def _fan_out(self) -> None:
        for receiver in self.receivers:
            name = f"push-{self.plan.version}-rank{receiver.rank}"
            threading.Thread(target=self._deliver, args=(receiver,), name=name, daemon=True).start()

    def wait(self, timeout_s: float) -> dict[str, Outcome]:
        """Outcomes of all receivers, waiting up to `timeout_s` for the stragglers (they count as failed)."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._done:
            while len(self._outcomes) < len(self.receivers):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._done.wait(remaining)
            outcomes = dict(self._outcomes)
        for receiver in self.receivers:
            outcomes.setdefault(
                receiver.replica_id, Outcome(False, f"no acknowledgement within {timeout_s:.1f} s", timeout_s)
            )
        return outcomes

    def give_up_on(self, replica_id: str, error: str) -> None:
        """Count a receiver that has not answered as failed now (it was declared dead): `wait` stops waiting
        for it, and its late answer, if any, changes nothing."""
        with self._done:
            if any(r.replica_id == replica_id for r in self.receivers) and replica_id not in self._outcomes:
                self._outcomes[replica_id] = Outcome(False, error, 0.0)
                self._done.notify_all()

    def outcomes_so_far(self) -> dict[str, Outcome]:
        with self._done:
            return dict(self._outcomes)

    def outcomes_from_acks(self, acks: list[ReceiverAck], seconds: float) -> dict[str, Outcome]:
        """An in-band push's outcomes: a receiver took it when the learner relays its ack, signed under its push
        key, for the plan's version; a receiver declared dead meanwhile (`give_up_on`) did not."""
        by_rank = {ack.rank: ack for ack in acks}
        outcomes = self.outcomes_so_far()
        for r in self.receivers:
            ack = by_rank.get(r.rank)
            if r.replica_id in outcomes:
                continue
            if ack is None:
                outcome = Outcome(False, "no acknowledgement among those the learner collected", seconds)
            elif ack.error:
                outcome = Outcome(False, ack.error, seconds)
            elif not hmac.compare_digest(ack.ack_mac, push_ack_mac(r.push_key, self.push_id, r.rank, ack.weight_version,
                                                                   ack.adapter_checksum)):
                outcome = Outcome(False, "its acknowledgement is not signed under its push key", seconds)
            elif ack.weight_version != self.plan.version:
                outcome = Outcome(False, f"replica reports version {ack.weight_version} after a push of "
                                         f"{self.plan.version}", seconds)
            else:
                outcome = Outcome(True, "", seconds, adapter_checksum=ack.adapter_checksum)
            outcomes[r.replica_id] = outcome
        return outcomes

    def _deliver(self, receiver: Receiver) -> None:
        start = time.monotonic()
        unreachable = False
        try:
            order = push_order_mac(receiver.push_key, member_plan(self.plan, receiver.rank), receiver.rank)
            answer = self._notify(receiver.address, self.plan, receiver.rank, self._call_timeout_s, order)
            version, checksum = answer.weight_version, answer.adapter_checksum
            ok = version == self.plan.version
            error = "" if ok else f"replica reports version {version} after a push of {self.plan.version}"
        except Exception as err:  # noqa: BLE001 - any failure of one receiver drops just that receiver
            ok, error, checksum = False, f"{type(err).__name__}: {err}", ""
            unreachable = isinstance(err, ReceiverUnreachable)
        with self._done:
            self._outcomes.setdefault(receiver.replica_id, Outcome(ok, error, time.monotonic() - start, unreachable,
                                                                   adapter_checksum=checksum))
            self._done.notify_all()
