"""`ControllerState`: the controller's thread-safe state and operations (no gRPC in here).

Its parts are explicit collaborators around one set of books (`controller.books.StateBooks`: the lock and its
condition, the clocks, the registry, the lease book, the push coordinator, the policy version, the learner's
seat, events, metrics, the store):

- `admission` (`controller.admission.Admission`) grants leases under the η rule, counts held requests, takes
  leases back;
- `seating` (`controller.seating.LearnerSeating`) gives and checks the learner's seat;
- `reachability` (`controller.reachability.ReplicaReachability`) challenges new registrations;
- `liveness` (`controller.liveness.Liveness`) reaps silent replicas and due leases, and forgives the
  controller's own stalls.

This class keeps the operations that span them: replicas registering and heartbeating, pushes (opened, settled
and aborted by the `PushCoordinator`, `asyncrl.push.coordinator`, under the lock; its fan-out runs on its own
threads and the commit waits for the acks *outside* the lock), timeline resets, the learner's heartbeat and
the snapshot. Every operation takes the lock, lazily reaps what is due (so correctness never depends on the
reaper thread's timing), mutates, writes its event records and ends with `StateBooks.changed`: the store (a
restarted controller continues from it), the gauges, and a wake-up of the held lease requests.

Clocks: `clock` (monotonic seconds, injectable) drives liveness: heartbeats, lease TTLs, push ages. Holding
uses real time (`time.monotonic`) because it is a real wait.
"""

from __future__ import annotations

import hmac
import time
from collections import deque
from collections.abc import Callable

from asyncrl.controller import staleness
from asyncrl.controller.admission import Admission
from asyncrl.controller.books import StateBooks
from asyncrl.controller.controller_metrics import ControllerMetrics
from asyncrl.controller.errors import NotTheReplica, PreconditionFailed, ReplicaIdInUse
from asyncrl.controller.learner_seat import Probe
from asyncrl.controller.liveness import Liveness
from asyncrl.controller.persistence import (
    ControllerStore,
    NoStore,
    SavedState,
    StateOfAnotherRun,
    restore_books,
)
from asyncrl.controller.reachability import ReplicaReachability
from asyncrl.controller.registry import Replica
from asyncrl.controller.results import (
    CommitResult,
    LearnerFigures,
    LearnerPulse,
    LearnerReport,
    Registration,
    ReplicaPulse,
    TimelineReset,
)
from asyncrl.controller.seating import LearnerSeating
from asyncrl.controller.views import learner_view, replica_view
from asyncrl.core.buffer.lease_writes import LeaseWriteCounts
from asyncrl.core.config.schema import ControllerConfig
from asyncrl.core.records import controller as records
from asyncrl.core.runtime.events import EventSink, NoEvents
from asyncrl.core.wire.auth import replica_call_mac
from asyncrl.core.wire.learner_secret import SeatProofs
from asyncrl.push.coordinator import NEW
from asyncrl.push.plan import PushOffer
from asyncrl.push.session import PushSession, ReceiverAck, WeightNotifier, judge_adapter

_HISTORY = 1000
"""Learner steps the status page's charts keep."""
_CHECK_WORKERS = 4
"""Reachability checks (and dials of silent replicas) in flight at once (one that times out takes 2 s)."""


class ControllerState:
    def __init__(
        self,
        config: ControllerConfig,
        batch_size: int,
        *,
        events: EventSink | None = None,
        metrics: ControllerMetrics | None = None,
        notify: WeightNotifier,
        probe: Probe | None = None,
        learner_probe: Probe | None = None,
        learner_secret: bytes | None = None,
        lease_writes: LeaseWriteCounts | None = None,
        gone: Callable[[str], bool] | None = None,
        store: ControllerStore | None = None,
        run_id: str = "",
        clock=time.monotonic,
        wall_clock=time.time,
    ):
        """`probe`: (address, challenge) -> a replica's answer (None: ids and addresses are never checked);
        `learner_probe`: the same for the seated learner; `learner_secret`: registrations of a learner must
        prove it (None: any token holder may, as in unit tests and under `security.insecure`);
        `lease_writes`: what reached the buffer under each lease (None: a completion's claim stands); `gone`:
        address -> True when a connection there is refused (None: never dial)."""
        self.books = StateBooks(config, batch_size, events=events or NoEvents(), metrics=metrics or ControllerMetrics(),
                                notify=notify, store=store or NoStore(), run_id=run_id, learner_probe=learner_probe,
                                clock=clock, wall_clock=wall_clock)  # fmt: skip
        self.config, self.batch_size, self.eta = config, batch_size, config.eta
        self.events, self.metrics = self.books.events, self.books.metrics
        self.liveness = Liveness(self.books, gone, _CHECK_WORKERS)
        self.reachability = ReplicaReachability(self.books, probe, _CHECK_WORKERS)
        self.admission = Admission(self.books, self.liveness, lease_writes)
        self.seating = LearnerSeating(self.books, SeatProofs(learner_secret, wall_clock))
        self._history: deque[dict] = deque(maxlen=_HISTORY)
        """The learner's figures per step (the status page's charts), the last _HISTORY steps."""
        self.restored = self._restore(self.books.writer.store.load())
        self.books.publish_gauges()
        self.metrics.follow(self.snapshot)

    def close(self) -> None:
        """Stop the reaper and the checks, close the event log and the store (idempotent)."""
        self.liveness.close()
        self.reachability.close()
        self.events.close()
        self.books.writer.store.close()

    # ---- replicas -------------------------------------------------------------------------------------

    def register(self, address: str, replica_id: str, weight_version: int, engine: str,
                 push_key: bytes = b"", in_band: bool = False, caller_host: str = "") -> Registration:
        """Add a replica, or register one again: its own process (it presents its current `push_key`), or a
        new process taking the id over from a holder that is gone (a restart). An id whose holder still proves
        itself alive (`probe`, outside the lock) is refused: one caller cannot redirect another replica's
        pushes to itself. `caller_host`: where the call came from (`controller.max_replicas_per_host`)."""
        books = self.books
        holder = self._live_holder(replica_id)
        if holder is not None and push_key and hmac.compare_digest(push_key, holder.push_key):
            holder = None  # the holder itself
        if holder is not None and self.reachability.answers(holder.address, holder.push_key):
            raise ReplicaIdInUse(f"replica_id: {replica_id!r} is registered by a live replica at "
                                 f"{holder.address}; choose another id")
        with books.cond:
            self.liveness.reap_locked()
            reregistered = bool(replica_id) and books.registry.known(replica_id)
            if reregistered:
                # A restarted replica lost whatever it was generating: its old leases return their quota.
                self.liveness.log_expired(books.leases.expire_replica(replica_id, "reregistered"), "reregistered")
            evicted = books.registry.make_room(replica_id)
            if evicted is not None:
                self.events.write(records.ReplicaForgotten(replica_id=evicted.replica_id,
                                                           silent_s=evicted.heartbeat_age(books.clock())))
            replica = books.registry.register(address, replica_id, weight_version, engine, books.clock(), in_band,
                                              caller_host)
            if reregistered:
                books.pushes.replica_registered(replica.replica_id)
            self.reachability.check_soon(replica)
            needs_sync = replica.needs_sync(books.current_version)
            self.events.write(records.ReplicaRegistered(
                replica_id=replica.replica_id, address=address, weight_version=weight_version, engine=engine,
                needs_sync=needs_sync, current_version=books.current_version, reregistered=reregistered,
            ))  # fmt: skip
            books.changed(replicas=True)
            return Registration(replica.replica_id, books.current_version, needs_sync,
                                self.config.heartbeat_interval_s, replica.push_key)

    def _live_holder(self, replica_id: str) -> Replica | None:
        books = self.books
        with books.cond:
            self.liveness.reap_locked()
            if not replica_id or not books.registry.known(replica_id):
                return None
            replica = books.registry.get(replica_id)
            return replica if replica.alive else None

    def check_replica(self, replica_id: str, proof: bytes) -> None:
        """The call speaks for `replica_id` only with its registration's proof (`replica_call_mac` under the
        push key it was given): UnknownReplica for an id nobody holds (it registers again), NotTheReplica for
        a caller that cannot prove the id."""
        with self.books.cond:
            key = self.books.registry.get(replica_id).push_key
        if not hmac.compare_digest(proof, replica_call_mac(key, replica_id)):
            raise NotTheReplica(f"replica_proof: the call does not prove the registration of {replica_id!r} "
                                "(HMAC of 'replica\\n' + replica_id under its push_key)")

    def heartbeat(self, replica_id: str, weight_version: int, held_leases: list[str] | None = None,
                  adapter_checksum: str = "") -> ReplicaPulse:  # fmt: skip
        """A replica's sign of life; `held_leases` (when reported) are the leases it still works on;
        `adapter_checksum`: the adapter its engine serves (the status page holds it against the pushed one)."""
        books = self.books
        with books.cond:
            replica = books.registry.get(replica_id)
            lagged = replica.needs_sync(books.current_version)
            # Touch before reaping: a replica that speaks is alive, whatever its silence before.
            revived = self.liveness.touch(replica)
            self.liveness.reap_locked()
            # The version is the last push it acknowledged, not what it says (`registry`: a replica earns its
            # leases); the adapter it reports is shown only when it speaks of those weights.
            if weight_version == replica.weight_version:
                replica.adapter_checksum = adapter_checksum
            held = None if held_leases is None else set(held_leases)
            abandoned = books.leases.extend(replica_id, books.clock(), held, self.config.lease_report_grace_s)
            if abandoned:
                self.liveness.log_expired(abandoned, "abandoned")
                books.changed()
            needs_sync = replica.needs_sync(books.current_version)
            # Wake held requests only when this replica's own eligibility may have changed.
            books.changed(wake=revived or lagged != needs_sync)
            held_back_s = max(0.0, replica.held_back_until - books.clock())
            return ReplicaPulse(books.current_version, needs_sync, held_back_s,
                                replica.push_problem if held_back_s else "")

    # ---- weight pushes --------------------------------------------------------------------------------

    def begin_push(self, version: int, offer: PushOffer, unused_push_id: str = "") -> PushSession:
        """Open a push of `version` (current+1: new policy; current: resync) and start its fan-out. A push
        reserved at the last commit is closed (`PushCoordinator.close_reserved`: quietly when `unused_push_id`
        names it)."""
        books = self.books
        with books.cond:
            self.liveness.reap_locked()
            session = books.pushes.begin(version, books.current_version, offer, books.clock(), unused_push_id)
            books.changed(replicas=True)  # an aborted predecessor flagged its receivers
            return session

    def commit_push(self, push_id: str, sender_ok: bool, error: str = "", missing_ranks: tuple[int, ...] = (),
                    acks: tuple[ReceiverAck, ...] = (), reserve_next: bool = False,
                    learner_seconds: float = 0.0, adapter_checksum: str = "") -> CommitResult:  # fmt: skip
        """Wait (bounded) for the receivers' acks, drop the failed ones, commit the version. A push the sender
        failed is aborted; its receivers that never joined (`missing_ranks`) or could not be reached are held
        back from the next pushes (`Replica.hold_back`), so the retry goes without them. An in-band push's acks
        come with the commit (`acks`, relayed by the learner): nothing to wait for. With `reserve_next`, the
        next push is reserved for the learner when it can go in-band (`CommitResult.next_push`). A reserved
        push is timed from `learner_seconds` (the learner's own measure up to this call): the controller did
        not see it begin. An adapter push names the checksum of the adapter sent (`adapter_checksum`): a receiver
        that does not serve that adapter failed the push (`session.judge_adapter`)."""
        books = self.books
        with books.cond:
            session, wait_s = books.pushes.start_commit(push_id, books.clock(), bool(acks), learner_seconds,
                                                        adapter_checksum)
            if not sender_ok:
                so_far = session.outcomes_so_far()
                books.pushes.hold_back_failed(session, so_far, books.clock(), missing_ranks, error)
                self.liveness.bury_unreachable(so_far)
                books.pushes.abort(session, f"sender failed: {error or 'no detail'}")
                books.changed(replicas=True)
                return CommitResult(False, books.current_version, [], [r.replica_id for r in session.receivers])
        if session.in_band:
            outcomes = session.outcomes_from_acks(list(acks), books.clock() - session.begun_at)
        else:
            outcomes = session.wait(wait_s)  # outside the lock: leases keep flowing meanwhile
        outcomes = {rid: judge_adapter(outcome, adapter_checksum) for rid, outcome in outcomes.items()}
        with books.cond:
            acked, dropped = books.pushes.settle(session, outcomes, adapter_checksum)
            books.pushes.hold_back_failed(session, outcomes, books.clock())
            self.liveness.bury_unreachable(outcomes)
            if session.mode == NEW:
                books.current_version = max(books.current_version, session.plan.version)  # versions only grow
            books.pushes.record_commit(session, books.current_version, acked, dropped,
                                       books.clock() - session.begun_at)  # fmt: skip
            reserved = books.pushes.reserve(session, books.current_version, books.clock()) if reserve_next else None
            books.changed(replicas=True)
            return CommitResult(True, books.current_version, acked, dropped, reserved)

    def reset_timeline(self, version: int, admitted: int, prompt_index: int) -> TimelineReset:
        """The learner continues from a checkpoint at `version`, behind the controller (it restarted alone):
        every active lease (admitted on the lost timeline) expires, an open push is aborted, every replica
        needs a resync (its weights may be the lost timeline's), and the version, N_r and the prompt cursor
        (never moved back) start the new timeline."""
        books = self.books
        with books.cond:
            self.liveness.reap_locked()
            previous = books.current_version
            if version > previous:
                raise PreconditionFailed(f"version: {version} is ahead of the controller's {previous}; a learner "
                                         "ahead of its controller pushes its weights instead")
            books.pushes.abort_held("timeline reset by the learner")
            expired = books.leases.expire_all("timeline_reset")
            self.liveness.log_expired(expired, "timeline_reset")
            cursor = books.leases.restart_counts(admitted, prompt_index)
            for replica in books.registry.all():
                replica.force_sync = True
            books.current_version = version
            self.events.write(records.TimelineReset(version=version, previous_version=previous, admitted=admitted,
                                                    prompt_index=cursor, leases_expired=len(expired)))  # fmt: skip
            books.changed(replicas=True)
            return TimelineReset(version, len(expired), cursor)

    def learner_heartbeat(self, step: int, version: int, consumed: int,
                          figures: LearnerFigures | None = None) -> LearnerPulse:
        """Record the learner's progress (and, after a step, its figures: the status page's history); ask for
        a resync push when a live replica needs one."""
        books = self.books
        with books.cond:
            self.liveness.reap_locked()
            now = books.clock()
            # A heartbeat while waiting for data carries no figures: the last step's stay on show.
            shown = figures or (books.learner.progress if books.learner is not None else None)
            books.learner = LearnerReport(step, version, consumed, now, shown)
            if figures is not None and figures.get("reward_mean") is not None and (
                    not self._history or self._history[-1]["step"] != step):
                self._history.append({"step": step, "t": books.wall(), **figures.values})
            lagging = any(r.needs_sync(books.current_version) for r in books.registry.live() if r.pushable(now))
            return LearnerPulse(lagging and not books.pushes.is_fresh(now), books.current_version)

    # ---- housekeeping and views -----------------------------------------------------------------------

    @property
    def current_version(self) -> int:
        with self.books.cond:
            return self.books.current_version

    @property
    def admitted(self) -> int:
        with self.books.cond:
            return self.books.leases.admitted

    @property
    def next_prompt_index(self) -> int:
        """The stream's next prompt (every one below it was handed out)."""
        with self.books.cond:
            return self.books.leases.next_prompt_index

    def snapshot(self) -> dict:
        """Everything the status page, /status and GetStatus show, as plain JSON-able data."""
        books = self.books
        with books.cond:
            self.liveness.reap_locked()
            now, current = books.clock(), books.current_version
            return {
                "current_version": current,
                "admitted": books.leases.admitted,
                "batch_size": self.batch_size,
                "eta": self.eta,
                "max_admissible": staleness.max_admissible(current, self.batch_size, self.eta),
                "held_requests": books.held,
                "next_prompt_index": books.leases.next_prompt_index,
                "prompts_to_regenerate": len(books.leases.regenerate),
                "active_leases": len(books.leases.active()),
                "leases_granted": books.leases.granted_total,
                "leases_expired": books.leases.expired_total,
                "pushes_committed": books.pushes.committed,
                "difficulty": {"tracked": books.difficulty.tracked, "hard": books.difficulty.hard,
                               "replays": books.difficulty.replays_total,
                               "replay_share": books.difficulty.cfg.replay_share},
                "open_push": books.pushes.view(now),
                "reserved_push": books.pushes.view(now, reserved=True),
                "learner": None if books.learner is None else learner_view(books.learner, now, self.batch_size,
                                                                            books.seat.holder.address),
                "history": list(self._history),
                "replicas": [replica_view(r, now, current, len(books.leases.of_replica(r.replica_id)),
                                          books.pushes.adapter_checksums.get(r.weight_version, ""))
                             for r in books.registry.all()],
            }  # fmt: skip

    # ---- restart ----------------------------------------------------------------------------------------

    def _restore(self, saved: SavedState | None) -> dict | None:
        """Continue from a saved state (a controller restart); returns what was restored, for the event log."""
        books = self.books
        if saved is not None:
            if saved.run_dir != books.run_id:
                raise StateOfAnotherRun(
                    f"controller.state_key: the store holds the controller state of run {saved.run_dir!r}, not "
                    f"{books.run_id!r}; use another controller.state_key, or delete it to start this run afresh"
                )
            books.current_version = saved.current_version
            books.pushes.committed = saved.pushes_committed
            books.seat.restore(saved.learner_key, saved.learner_address)
            restore_books(saved, books.leases, books.registry, books.clock())
            books.difficulty.restore(saved.prompts)
            for replica in books.registry.all():
                if not replica.reachable:  # its check died with the previous controller
                    self.reachability.check_soon(replica)
        books.persist(replicas_changed=True)  # the baseline of later diffs
        return None if saved is None else saved.summary()
