"""Weight pushes: the `PushCoordinator` that opens, reserves, commits and aborts the one push in flight
(`controller.push_session.PushSession`: plan, receivers in rank order, outcomes).

Handshake (docs/architecture.md): Begin picks the receivers (every live replica for version current+1, the
live replicas that need sync for version == current; a replica held back after failed pushes sits them out),
ranks them 1..N, builds the plan (world_size N+1) and fans out: one thread per receiver calls the injected
`WeightNotifier` (in production `asyncrl.services.weight_fanout.grpc_update_weights`, i.e.
`Rollout.UpdateWeights(plan, rank)`, signed for that replica: `asyncrl.core.auth.push_order_mac`), which
returns once the replica has joined the broadcast and loaded the weights. The plan names a broadcast group:
the one of the previous push when the receivers, their ranks, the sender's store and the transport are the
same and that push was acknowledged by all (every member still holds it), else a new one (`Membership`;
`asyncrl.core.weights.groups`). Commit waits for the acks
(bounded by push_timeout_s from Begin) *outside* the controller's lock, so lease traffic keeps flowing,
then drops and flags the receivers that failed.

A push that reuses a group whose members all follow it (they registered with `in_band_pushes`), for a
learner that offers it, goes in-band instead (`asyncrl.core.weights.in_band`): no fan-out; Begin hands the
learner each rank's signed order, and Commit takes the receivers' signed acks from the learner
(`PushSession.outcomes_from_acks`), checks each under the replica's push key and waits for nothing.
A learner that asks for it (`CommitWeightPush.reserve_next`) gets the next such push's plan with the commit
(`reserve`), so an in-band push costs it one controller call, not two. The reservation is void as soon as the
next Begin comes (quietly when the learner names it unused) or one of its receivers registers again.

The coordinator's collaborators are explicit: the replica registry (whose sync flags a push changes), the
notifier, the event sink and the metrics. It does not own the policy version: `ControllerState` holds the
lock around every coordinator call, commits the version a push reports and wakes held lease requests.
"""

from __future__ import annotations

import dataclasses
import uuid

from asyncrl.controller.controller_metrics import ControllerMetrics
from asyncrl.controller.errors import PreconditionFailed
from asyncrl.controller.event_records import EventSink
from asyncrl.controller.push_session import (
    Membership,
    Outcome,
    PushOffer,
    PushSession,
    Receiver,
    WeightNotifier,
)
from asyncrl.controller.registry import ReplicaRegistry
from asyncrl.core.config import ControllerConfig
from asyncrl.core.weights.plan import PushPlan

NEW = "new"
"""A push of version current+1 to every live replica."""
RESYNC = "resync"
"""A push of the current version to the live replicas that need it."""


class PushCoordinator:
    """Opens, commits and aborts pushes, one at a time. Every method runs under the controller's lock."""

    def __init__(self, config: ControllerConfig, registry: ReplicaRegistry, notify: WeightNotifier,
                 events: EventSink, metrics: ControllerMetrics):  # fmt: skip
        self._config, self._registry, self._notify = config, registry, notify
        self._events, self._metrics = events, metrics
        self.open: PushSession | None = None
        self.reserved: PushSession | None = None
        """The next push, opened at the last commit for its learner (`reserve`); never at once with `open`."""
        self.committed = 0
        self.group: Membership | None = None
        """The broadcast group every member holds after the last fully acknowledged push (None: the next push
        forms one). Any drop or abort forgets it: a member may have left it half-used."""
        self.group_base: tuple[str, str] | None = None
        """(codec, push id) of the last push on `group` when it named a delta codec: every member holds its
        bytes as the group's delta base (`asyncrl.core.weights.delta`)."""
        self.group_last_push = ""
        """The last push on `group`: members that follow the group wait for the order of the one after it."""
        self.groups_formed = 0

    def begin(self, version: int, current: int, offer: PushOffer, now: float, unused_push_id: str = "") -> PushSession:
        """Pick the receivers, rank them 1..N, build the plan, start the fan-out. A reserved push is closed
        first: quietly when the learner names it unused, else as an aborted push (`close_reserved`)."""
        self.close_reserved(unused_push_id, offer.store_address)
        aborted_previous = None
        if self.open is not None:
            age = now - self.open.begun_at
            # A learner at another store is a new learner process (the one that opened this push is gone:
            # a learner restarted while its push ran in the background): that push can never be committed.
            other_sender = self.open.plan.store_address != offer.store_address
            # A push whose commit already waits for its receivers is never superseded by its own learner: that
            # wait is itself bounded by push_timeout_s, so the learner just asks again a moment later.
            if not other_sender and (age < self._config.push_timeout_s or self.open.commit_started):
                step = "its commit is in progress" if self.open.commit_started else "commit it first"
                raise PreconditionFailed(
                    f"push {self.open.push_id!r} (version {self.open.plan.version}) is still open "
                    f"({age:.1f} s old); {step}"
                )
            aborted_previous = self.open.push_id
            self.abort(self.open, f"superseded by a learner at {offer.store_address}" if other_sender
                       else f"no commit within push_timeout_s ({age:.1f} s)")
        mode, receivers = self._choose(version, current, now)
        membership, new_group = self._membership(receivers, offer)
        if new_group and receivers:  # a push to nobody (a resync nobody needs any more) leaves the group alone
            self.group, self.group_base, self.group_last_push = None, None, ""
            self.groups_formed += 1
            self._metrics.groups_formed.inc()
        session = self._session(version, mode, receivers, membership, new_group, offer, now)
        self.open = session
        self._record_begun(session, current, aborted_previous)
        session.start()
        return session

    def reserve(self, committed: PushSession, current: int, now: float) -> PushSession | None:
        """Right after `committed` was committed: open the next push (current + 1) with its offer, for its
        learner to order without a Begin, when that push can go in-band (the group kept, every live pushable
        replica in it, all following it). It is not open: no time-out, not fresh (a resync goes first); it
        becomes the open push when a commit names it (`start_commit`), and the next Begin closes it."""
        if self.open is not None or self.reserved is not None or self.group is None or not committed.offer.in_band:
            return None
        # The learner's base is its group's last push, as every member's is (`group_base`).
        base = self.group_base[1] if self.group_base is not None and committed.offer.delta_codec else ""
        offer = dataclasses.replace(committed.offer, delta_base_push_id=base)
        mode, receivers = self._choose(current + 1, current, now)
        membership, new_group = self._membership(receivers, offer)
        if new_group or not self._in_band(offer, receivers):
            return None
        session = self._session(current + 1, mode, receivers, membership, False, offer, now, reserved=True)
        self.reserved = session
        self._record_begun(session, current, None)
        return session

    def close_reserved(self, unused_push_id: str = "", store_address: str = "", reason: str = "") -> None:
        """Close the reserved push, if any. Its learner naming it unused (`unused_push_id`, from its store)
        closes it quietly (`push_withdrawn`): nobody was ordered to take it. Otherwise its receivers may have
        taken it (the learner orders a reservation without telling the controller), so it is aborted."""
        session = self.reserved
        if session is None:
            return
        if unused_push_id == session.push_id and store_address == session.plan.store_address:
            self.reserved = None
            self._events.write("push_withdrawn", push_id=session.push_id, version=session.plan.version,
                               reason="the learner began another push instead")  # fmt: skip
            return
        self.abort(session, reason or "reserved, then superseded by another push's Begin")

    def _choose(self, version: int, current: int, now: float) -> tuple[str, list[Receiver]]:
        """The push's mode and receivers in rank order: every live replica for a new version, those that need
        it for a resync; replicas held back after failed pushes (`Replica.hold_back`) sit it out."""
        pushable = [r for r in self._registry.live() if r.pushable(now)]
        if version == current + 1:
            mode, chosen = NEW, pushable
        elif version == current:
            mode, chosen = RESYNC, [r for r in pushable if r.needs_sync(current)]
        else:
            raise PreconditionFailed(
                f"version: must be {current + 1} (new policy) or {current} (resync), got {version}"
            )
        return mode, [Receiver(r.replica_id, r.address, rank, r.push_key) for rank, r in enumerate(chosen, start=1)]

    def _membership(self, receivers: list[Receiver], offer: PushOffer) -> tuple[Membership, bool]:
        """The group the receivers would use (the kept one when they are its members) and whether it is new."""
        membership = Membership("", tuple((r.replica_id, r.address, r.push_key) for r in receivers),
                                offer.store_address, offer.transport)
        if self.group is not None and self.group.same(membership):
            return self.group, False
        return dataclasses.replace(membership, group_id=f"group-{uuid.uuid4().hex[:12]}"), True

    def _in_band(self, offer: PushOffer, receivers: list[Receiver]) -> bool:
        """In-band when the learner offers it and every member of the kept group follows it (`weights.in_band`)."""
        return offer.in_band and bool(receivers) and all(self._registry.get(r.replica_id).in_band for r in receivers)

    def _session(self, version: int, mode: str, receivers: list[Receiver], membership: Membership,
                 new_group: bool, offer: PushOffer, now: float, reserved: bool = False) -> PushSession:
        plan = PushPlan(
            push_id=f"push-v{version}-{uuid.uuid4().hex[:8]}", version=version, store_address=offer.store_address,
            world_size=len(receivers) + 1, transport=offer.transport, tensors=tuple(offer.tensors),
            bucket_bytes=offer.bucket_bytes, timeout_s=offer.timeout_s or self._config.push_timeout_s,
            join_timeout_s=offer.join_timeout_s, group_id=membership.group_id, new_group=new_group,
            manifest_digest=offer.manifest_digest, delta_codec=offer.delta_codec,
            delta_base_push_id=self._delta_base(offer, new_group),
        )  # fmt: skip
        in_band = not new_group and self._in_band(offer, receivers)
        session = PushSession(plan, mode, receivers, now, self._notify, self._config.push_timeout_s,
                              after_push_id=self.group_last_push if in_band else "", offer=offer, reserved=reserved)
        session.membership = membership
        return session

    def _record_begun(self, session: PushSession, current: int, aborted_previous: str | None) -> None:
        plan = session.plan
        self._events.write(
            "push_begun", push_id=plan.push_id, version=plan.version, mode=session.mode,
            receivers=[r.replica_id for r in session.receivers], world_size=plan.world_size,
            current_version=current, aborted_previous=aborted_previous, group_id=plan.group_id,
            new_group=plan.new_group, delta_base_push_id=plan.delta_base_push_id, in_band=session.in_band,
            reserved=session.reserved,
        )  # fmt: skip

    def _delta_base(self, offer: PushOffer, new_group: bool) -> str:
        """The push a new plan is a delta against: the learner's base when every member holds it too."""
        if new_group or not offer.delta_codec or not offer.delta_base_push_id:
            return ""
        return offer.delta_base_push_id if self.group_base == (offer.delta_codec, offer.delta_base_push_id) else ""

    def start_commit(self, push_id: str, now: float, relays_acks: bool = False,
                     learner_seconds: float = 0.0) -> tuple[PushSession, float]:  # fmt: skip
        """Mark the open push as committing; returns it and how long its receivers may still take.
        `relays_acks`: the commit carries receivers' acks, which only an in-band push takes. A commit naming
        the reserved push makes it the open one (its learner ordered it), begun `learner_seconds` ago by the
        learner's own measure: the controller did not see it begin."""
        if self.open is None and self.reserved is not None and self.reserved.push_id == push_id:
            self.open, self.reserved = self.reserved, None
            self.open.begun_at = now - learner_seconds
        if self.open is None or self.open.push_id != push_id:
            open_id = f" (the open push is {self.open.push_id!r})" if self.open else " (no push is open)"
            raise PreconditionFailed(f"push_id: {push_id!r} is not the open push{open_id}")
        if self.open.commit_started:
            raise PreconditionFailed(f"push_id: a commit of {push_id!r} is already in progress")
        if relays_acks and not self.open.in_band:
            raise PreconditionFailed(f"acks: push {push_id!r} was ordered by the controller, whose receivers "
                                     "answer it themselves; only an in-band push takes acks from the learner")
        self.open.commit_started = True
        return self.open, self._config.push_timeout_s - (now - self.open.begun_at)

    def settle(self, session: PushSession, outcomes: dict[str, Outcome]) -> tuple[list[str], list[str]]:
        """Close a push whose acks are in: acked receivers hold its version, the others need a resync.
        Returns (acked, dropped) replica ids."""
        if self.open is not session:
            raise PreconditionFailed(
                f"push_id: push {session.push_id!r} was aborted while waiting for its receivers"
            )
        self.open = None
        acked = [r.replica_id for r in session.receivers if outcomes[r.replica_id].ok]
        dropped = [r.replica_id for r in session.receivers if not outcomes[r.replica_id].ok]
        if session.receivers:  # a push to nobody broadcast nothing: every member still holds what it held
            self.group = None if dropped else session.membership
            self.group_last_push = session.push_id if self.group is not None else ""
            kept_base = self.group is not None and session.plan.delta_codec
            self.group_base = (session.plan.delta_codec, session.push_id) if kept_base else None
        for replica_id in acked:
            replica = self._registry.get(replica_id)
            replica.weight_version, replica.force_sync = session.plan.version, False
            replica.clear_push_failures()
        for replica_id in dropped:
            self._registry.get(replica_id).force_sync = True
            self._events.write(
                "replica_dropped", push_id=session.push_id, replica_id=replica_id, version=session.plan.version,
                error=outcomes[replica_id].error,
            )  # fmt: skip
        return acked, dropped

    def record_commit(self, session: PushSession, version_after: int, acked: list[str], dropped: list[str],
                      seconds: float) -> None:  # fmt: skip
        self.committed += 1
        self._metrics.pushes_committed.inc()
        if session.in_band:
            self._metrics.pushes_in_band.inc()
        self._metrics.replicas_dropped.inc(len(dropped))
        self._metrics.push_seconds.observe(max(0.0, seconds))
        self._events.write(
            "push_committed", push_id=session.push_id, version=version_after, mode=session.mode,
            acked=acked, dropped=dropped, seconds=seconds, in_band=session.in_band,
        )  # fmt: skip

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
        for replica_id, problem in problems.items():
            replica = self._registry.get(replica_id)
            seconds = replica.hold_back(now, self._config.push_backoff_s, problem)
            self._events.write("replica_held_back", replica_id=replica_id, address=replica.address,
                               seconds=seconds, failures=replica.push_failures, problem=problem)  # fmt: skip

    def abort(self, session: PushSession, reason: str) -> None:
        # A receiver may have loaded part of the weights in flight: treat them all as possibly mixed.
        for receiver in session.receivers:
            self._registry.get(receiver.replica_id).force_sync = True
        if self.open is session:
            self.open = None
        if self.reserved is session:
            self.reserved = None
        self.group, self.group_base, self.group_last_push = None, None, ""
        self._events.write(
            "push_aborted", push_id=session.push_id, version=session.plan.version, mode=session.mode,
            reason=reason,
        )  # fmt: skip

    def receiver_died(self, replica_id: str, error: str) -> None:
        """A replica was declared dead: if the open (or reserved) push waits for it, it no longer does."""
        for session in (self.open, self.reserved):
            if session is not None:
                session.give_up_on(replica_id, error)

    def replica_registered(self, replica_id: str) -> None:
        """A replica registered again (a new process, a new push key): a reserved push ordering it is void."""
        if self.reserved is not None and any(r.replica_id == replica_id for r in self.reserved.receivers):
            self.close_reserved(reason=f"its receiver {replica_id} registered again")

    def is_fresh(self, now: float) -> bool:
        """A push is open and still inside its time-out (a resync request would only collide with it)."""
        return self.open is not None and now - self.open.begun_at < self._config.push_timeout_s

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
