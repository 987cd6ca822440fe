"""The controller's side of the push: the `PushCoordinator` opens, reserves, commits and aborts the one push
it holds (`push.protocol.PushSlot`), and keeps the broadcast group its receivers hold between pushes.

Handshake (docs/architecture.md, "Weight push"): Begin picks the receivers (every live replica for version
current+1, the live replicas that need sync for version == current; a replica held back after failed pushes
sits them out), ranks them 1..N, builds the plan (world_size N+1) and fans out: one thread per receiver calls
the injected `WeightNotifier` (in production `push.fanout.ReplicaChannels.update_weights`, i.e.
`Rollout.UpdateWeights(plan, rank)`, signed for that replica: `asyncrl.core.wire.auth.push_order_mac`), which
returns once the replica has joined the broadcast and loaded the weights. The plan names a broadcast group:
the one of the previous push when the receivers, their ranks, the sender's store and the transport are the
same and that push was acknowledged by all (every member still holds it), else a new one (`Membership`;
`push.groups`). Commit waits for the acks (bounded by push_timeout_s from Begin) *outside* the
controller's lock, so lease traffic keeps flowing, then drops and flags the receivers that failed.

At a commit, for a learner that offers it (`PushOffer.in_band`, `CommitWeightPush.reserve_next`), the next
push is reserved when it can go in-band: the group kept, every live pushable replica in it, all following it
(`push.in_band`). The learner orders it through its store without a Begin, and its commit carries the
receivers' signed acks (`PushSession.outcomes_from_acks`). The reservation is void as soon as the next Begin
comes (quietly when the learner names it unused) or one of its receivers registers again.

The collaborators are explicit: the replica book (whose sync flags a push changes), the notifier, the event
sink and the metrics. It does not own the policy version: the controller holds its lock around every call,
commits the version a push reports and wakes held lease requests.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Protocol

from asyncrl.core.records.controller import (
    PushAborted,
    PushBegun,
    PushCommitted,
    PushWithdrawn,
    ReplicaDropped,
    ReplicaHeldBack,
)
from asyncrl.core.runtime.events import EventSink
from asyncrl.push.plan import PushOffer, PushPlan
from asyncrl.push.protocol import Event, Phase, PushRefused, PushSlot
from asyncrl.push.session import Membership, Outcome, PushSession, Receiver, WeightNotifier

NEW = "new"
"""A push of version current+1 to every live replica."""
RESYNC = "resync"
"""A push of the current version to the live replicas that need it."""


class ReplicaBook(Protocol):
    """The controller's replica registry, as the coordinator uses it (`controller.registry.ReplicaRegistry`)."""

    def live(self) -> list: ...

    def get(self, replica_id: str): ...

    def note_hold_back(self, replica, now: float) -> list:
        """`replica` was just held back: the registrations at its host that inherit it (returned)."""


class PushMetrics(Protocol):
    """The push's Prometheus series, as the controller registers them (`controller.controller_metrics`)."""

    pushes_committed: object
    pushes_in_band: object
    groups_formed: object
    replicas_dropped: object
    push_seconds: object


@dataclasses.dataclass(frozen=True)
class KeptGroup:
    """The broadcast group every member holds after the last fully acknowledged push, and that push: members
    that follow the group wait for the order of the one after it."""

    membership: Membership
    last_push: str


@dataclasses.dataclass(frozen=True)
class PushTiming:
    """How long the controller gives a push: push_timeout_s from its Begin."""

    push_timeout_s: float
    push_backoff_s: float


ADAPTER_VERSIONS_KEPT = 64
"""Versions whose pushed adapter checksum the coordinator remembers (a replica this far behind needs a resync)."""


class PushCoordinator:
    """Opens, commits and aborts pushes, one at a time. Every method runs under the controller's lock."""

    def __init__(self, *, timing: PushTiming, replicas: ReplicaBook, notify: WeightNotifier, events: EventSink,
                 metrics: PushMetrics):  # fmt: skip
        self._timing, self._replicas, self._notify = timing, replicas, notify
        self._events, self._metrics = events, metrics
        self.slot: PushSlot[PushSession] = PushSlot()
        self.group: KeptGroup | None = None
        """None: the next push forms a group. Any drop or abort forgets it: a member may have left it half-used."""
        self.committed = 0
        self.groups_formed = 0
        self.adapter_checksums: dict[int, str] = {}
        """The checksum of the adapter the learner pushed for each recent version (adapter pushes only): what a
        replica serving that version must report."""

    @property
    def open(self) -> PushSession | None:
        """The push Begin opened (or a reserved one its learner ordered), until it is settled or aborted."""
        return self.slot.holds(Phase.OPEN, Phase.COMMITTING)

    @property
    def reserved(self) -> PushSession | None:
        return self.slot.holds(Phase.RESERVED)

    # ---- opening --------------------------------------------------------------------------------------

    def begin(self, version: int, current: int, offer: PushOffer, now: float, unused_push_id: str = "") -> PushSession:
        """Pick the receivers, rank them 1..N, build the plan, start the fan-out. A reserved push is closed
        first: quietly when the learner names it unused, else as an aborted push (`close_reserved`)."""
        self.close_reserved(unused_push_id, offer)
        aborted_previous = self._clear_for(offer, now)
        mode, receivers = self._choose(version, current, now)
        membership, new_group = self._membership(receivers, offer)
        if new_group and receivers:  # a push to nobody (a resync nobody needs any more) leaves the group alone
            self.group = None
            self.groups_formed += 1
            self._metrics.groups_formed.inc()
        session = self._session(version, mode, receivers, membership, new_group, offer, now)
        self.slot.fire(Event.BEGIN, session)
        self._record_begun(session, current, aborted_previous)
        session.start()
        return session

    def _clear_for(self, offer: PushOffer, now: float) -> str | None:
        """Empty the slot of an open push for a Begin from `offer`'s learner: abort it when its learner is gone
        (another store: a learner restarted while its push ran) or its time is up; refuse the Begin while it
        may still be committed. Returns the aborted push's id."""
        session = self.open
        if session is None:
            return None
        age = now - session.begun_at
        other_sender = session.plan.store != offer.store
        committing = self.slot.phase is Phase.COMMITTING
        # A commit already waiting for its receivers is never superseded by its own learner: that wait is
        # itself bounded by push_timeout_s, so the learner just asks again a moment later.
        if not other_sender and (age < self._timing.push_timeout_s or committing):
            step = "its commit is in progress" if committing else "commit it first"
            raise PushRefused(f"push {session.push_id!r} (version {session.plan.version}) is still open "
                              f"({age:.1f} s old); {step}")
        self.abort(session, f"superseded by a learner at {offer.store_address}" if other_sender
                   else f"no commit within push_timeout_s ({age:.1f} s)")
        return session.push_id

    def reserve(self, committed: PushSession, current: int, now: float) -> PushSession | None:
        """Right after `committed` was committed: reserve the next push (current + 1) with its offer, for its
        learner to order in-band without a Begin, when it can go in-band (the group kept, every live pushable
        replica in it, all following it). It has no time-out and is not fresh (a resync goes first)."""
        if self.slot.phase is not Phase.IDLE or self.group is None or not committed.offer.in_band:
            return None
        mode, receivers = self._choose(current + 1, current, now)
        membership, new_group = self._membership(receivers, committed.offer)
        if new_group or not receivers or not all(self._replicas.get(r.replica_id).in_band for r in receivers):
            return None
        session = self._session(current + 1, mode, receivers, membership, False, committed.offer, now,
                                after_push_id=self.group.last_push)
        self.slot.fire(Event.RESERVE, session)
        self._record_begun(session, current, None)
        return session

    def close_reserved(self, unused_push_id: str = "", offer: PushOffer | None = None, reason: str = "") -> None:
        """Close the reserved push, if any. Its learner naming it unused (`unused_push_id`, from its store)
        closes it quietly (`push_withdrawn`): nobody was ordered to take it. Otherwise its receivers may have
        taken it (the learner orders a reservation without telling the controller), so it is aborted."""
        session = self.reserved
        if session is None:
            return
        if unused_push_id == session.push_id and offer is not None and offer.store == session.plan.store:
            self.slot.fire(Event.WITHDRAW)
            self._events.write(PushWithdrawn(push_id=session.push_id, version=session.plan.version,
                                             reason="the learner began another push instead"))  # fmt: skip
            return
        self.abort(session, reason or "reserved, then superseded by another push's Begin")

    def _choose(self, version: int, current: int, now: float) -> tuple[str, list[Receiver]]:
        """The push's mode and receivers in rank order: every live replica for a new version, those that need
        it for a resync; replicas held back after failed pushes (`Replica.hold_back`) sit it out."""
        pushable = [r for r in self._replicas.live() if r.pushable(now)]
        if version == current + 1:
            mode, chosen = NEW, pushable
        elif version == current:
            mode, chosen = RESYNC, [r for r in pushable if r.needs_sync(current)]
        else:
            raise PushRefused(f"version: must be {current + 1} (new policy) or {current} (resync), got {version}")
        return mode, [Receiver(r.replica_id, r.address, rank, r.push_key) for rank, r in enumerate(chosen, start=1)]

    def _membership(self, receivers: list[Receiver], offer: PushOffer) -> tuple[Membership, bool]:
        """The group the receivers would use (the kept one when they are its members) and whether it is new."""
        membership = Membership("", tuple((r.replica_id, r.address, r.push_key) for r in receivers),
                                offer.store, offer.transport)
        if self.group is not None and self.group.membership.same(membership):
            return self.group.membership, False
        return dataclasses.replace(membership, group_id=f"group-{uuid.uuid4().hex[:12]}"), True

    def _session(self, version: int, mode: str, receivers: list[Receiver], membership: Membership,
                 new_group: bool, offer: PushOffer, now: float, after_push_id: str = "") -> PushSession:
        plan = PushPlan.from_offer(
            offer, default_timeout_s=self._timing.push_timeout_s, push_id=f"push-v{version}-{uuid.uuid4().hex[:8]}",
            version=version, world_size=len(receivers) + 1, group_id=membership.group_id, new_group=new_group,
        )  # fmt: skip
        return PushSession(plan=plan, mode=mode, receivers=receivers, membership=membership, begun_at=now,
                           notify=self._notify, call_timeout_s=self._timing.push_timeout_s, offer=offer,
                           after_push_id=after_push_id)  # fmt: skip

    def _record_begun(self, session: PushSession, current: int, aborted_previous: str | None) -> None:
        plan = session.plan
        self._events.write(PushBegun(
            push_id=plan.push_id, version=plan.version, mode=session.mode,
            receivers=[r.replica_id for r in session.receivers], world_size=plan.world_size,
            current_version=current, aborted_previous=aborted_previous, group_id=plan.group_id,
            new_group=plan.new_group, in_band=session.in_band, reserved=session.in_band,
        ))  # fmt: skip

    # ---- committing -----------------------------------------------------------------------------------

    def start_commit(self, push_id: str, now: float, relays_acks: bool = False, learner_seconds: float = 0.0,
                     adapter_checksum: str = "") -> tuple[PushSession, float]:  # fmt: skip
        """Mark the push `push_id` as committing; returns it and how long its receivers may still take.
        `relays_acks`: the commit carries receivers' acks, which only an in-band push takes. A commit naming
        the reserved push means its learner ordered it, `learner_seconds` ago by the learner's own measure:
        the controller did not see it begin."""
        session = self.slot.session
        if session is None or session.push_id != push_id:
            held = f" (the open push is {session.push_id!r})" if session is not None else " (no push is open)"
            raise PushRefused(f"push_id: {push_id!r} is not the open push{held}")
        if self.slot.phase is Phase.COMMITTING:
            raise PushRefused(f"push_id: a commit of {push_id!r} is already in progress")
        if session.plan.adapter is not None and not adapter_checksum:
            raise PushRefused(f"adapter_checksum: push {push_id!r} carries an adapter; its commit must name the "
                              "adapter's checksum, or nothing could tell a receiver that did not take it")
        if relays_acks and not session.in_band:
            raise PushRefused(f"acks: push {push_id!r} was ordered by the controller, whose receivers "
                              "answer it themselves; only an in-band push takes acks from the learner")
        if self.slot.phase is Phase.RESERVED:
            session.begun_at = now - learner_seconds
        self.slot.fire(Event.COMMIT)
        return session, self._timing.push_timeout_s - (now - session.begun_at)

    def settle(self, session: PushSession, outcomes: dict[str, Outcome],
               adapter_checksum: str = "") -> tuple[list[str], list[str]]:  # fmt: skip
        """Close a push whose answers are in: acked receivers hold its version (and, for an adapter push whose
        checksum the learner sent, serve that adapter: `outcomes` judged by `session.judge_adapter`), the others
        need a resync. Returns (acked, dropped) replica ids."""
        if self.slot.holds(Phase.COMMITTING) is not session:
            raise PushRefused(f"push_id: push {session.push_id!r} was aborted while waiting for its receivers")
        self.slot.fire(Event.SETTLE)
        acked = [r.replica_id for r in session.receivers if outcomes[r.replica_id].ok]
        dropped = [r.replica_id for r in session.receivers if not outcomes[r.replica_id].ok]
        if session.receivers:  # a push to nobody broadcast nothing: every member still holds what it held
            self.group = None if dropped else KeptGroup(session.membership, session.push_id)
        if adapter_checksum:
            self.adapter_checksums[session.plan.version] = adapter_checksum
            for old in sorted(self.adapter_checksums)[:-ADAPTER_VERSIONS_KEPT]:
                del self.adapter_checksums[old]
        for replica_id in acked:
            replica = self._replicas.get(replica_id)
            replica.weight_version, replica.force_sync, replica.joined_a_push = session.plan.version, False, True
            replica.adapter_checksum = outcomes[replica_id].adapter_checksum
            replica.clear_push_failures()
        for replica_id in dropped:
            self._replicas.get(replica_id).force_sync = True
            self._events.write(ReplicaDropped(push_id=session.push_id, replica_id=replica_id,
                                              version=session.plan.version, error=outcomes[replica_id].error))
        return acked, dropped

    def record_commit(self, session: PushSession, version_after: int, acked: list[str], dropped: list[str],
                      seconds: float) -> None:  # fmt: skip
        self.committed += 1
        self._metrics.pushes_committed.inc()
        if session.in_band:
            self._metrics.pushes_in_band.inc()
        self._metrics.replicas_dropped.inc(len(dropped))
        self._metrics.push_seconds.observe(max(0.0, seconds))
        self._events.write(PushCommitted(push_id=session.push_id, version=version_after, mode=session.mode,
                                         acked=acked, dropped=dropped, seconds=seconds, in_band=session.in_band))

    def hold_back_failed(self, session: PushSession, outcomes: dict[str, Outcome], now: float,
                         missing_ranks=(), error: str = "") -> None:  # fmt: skip
        """Leave out of the next pushes (`Replica.hold_back`) the receivers of `session` that could not be
        reached, and those the sender names as never having joined (`missing_ranks`). Not the others: a receiver
        whose UpdateWeights failed because the sender called the push off is not to blame, and one that joined
        and then failed (it rejected the weights, say) is resynced at once."""
        problems = {rid: outcome.error for rid, outcome in outcomes.items() if outcome.unreachable}
        for receiver in session.receivers:  # the unreachable's own error names the address: it comes first
            if receiver.rank in missing_ranks:
                problems.setdefault(receiver.replica_id, f"did not join the broadcast of {session.push_id} "
                                                         f"({error or 'no detail'})")
        if missing_ranks:  # the sender saw every other receiver join
            for receiver in session.receivers:
                if receiver.replica_id not in problems:
                    self._replicas.get(receiver.replica_id).joined_a_push = True
        held = []
        for replica_id, problem in problems.items():
            replica = self._replicas.get(replica_id)
            seconds = replica.hold_back(now, self._timing.push_backoff_s, problem)
            held.append(replica)
            self._events.write(ReplicaHeldBack(replica_id=replica_id, address=replica.address, seconds=seconds,
                                               failures=replica.push_failures, problem=problem))  # fmt: skip
        for replica in held:  # after all of them: one held back by its own failure is not held back twice
            for peer in self._replicas.note_hold_back(replica, now):
                self._events.write(ReplicaHeldBack(
                    replica_id=peer.replica_id, address=peer.address, seconds=peer.held_back_until - now,
                    failures=peer.push_failures, problem=peer.push_problem))  # fmt: skip

    # ---- calling off ----------------------------------------------------------------------------------

    def abort(self, session: PushSession, reason: str) -> None:
        # A receiver may have loaded part of the weights in flight: treat them all as possibly mixed.
        for receiver in session.receivers:
            self._replicas.get(receiver.replica_id).force_sync = True
        if self.slot.session is session:
            self.slot.fire(Event.ABORT)
        self.group = None
        self._events.write(PushAborted(push_id=session.push_id, version=session.plan.version, mode=session.mode,
                                       reason=reason))

    def abort_held(self, reason: str) -> None:
        """Call off whatever push the slot holds (the timeline was reset)."""
        if self.slot.session is not None:
            self.abort(self.slot.session, reason)

    def receiver_died(self, replica_id: str, error: str) -> None:
        """A replica was declared dead: if the push held waits for it, it no longer does."""
        if self.slot.session is not None:
            self.slot.session.give_up_on(replica_id, error)

    def replica_registered(self, replica_id: str) -> None:
        """A replica registered again (a new process, a new push key): a reserved push ordering it is void."""
        reserved = self.reserved
        if reserved is not None and any(r.replica_id == replica_id for r in reserved.receivers):
            self.close_reserved(reason=f"its receiver {replica_id} registered again")

    # ---- views ----------------------------------------------------------------------------------------

    def is_fresh(self, now: float) -> bool:
        """A push is open and still inside its time-out (a resync request would only collide with it)."""
        session = self.open
        return session is not None and now - session.begun_at < self._timing.push_timeout_s

    def view(self, now: float, reserved: bool = False) -> dict | None:
        """The open push (or, with `reserved`, the one reserved at the last commit) for the status page and
        GetStatus (`PushStatus`)."""
        push = self.reserved if reserved else self.open
        if push is None:
            return None
        return {
            "push_id": push.push_id, "version": push.plan.version, "mode": push.mode,
            "receivers": [r.replica_id for r in push.receivers], "age_s": now - push.begun_at,
            "in_band": push.in_band,
        }  # fmt: skip
