"""`ControllerState`: the controller's thread-safe state and operations (no gRPC in here).

One lock, one condition variable (`_cond`) over it. Every operation takes the lock, lazily reaps what is
due (dead replicas, expired leases) so correctness never depends on the reaper thread's timing, mutates,
writes its event records, saves what changed to its store (`controller.persistence`: a restarted controller
continues from it) and updates the gauges. Leases are granted, held and taken back by the `Admission` part
(`controller.admission`); everything that can make a held request admissible wakes the held ones: returned
quota (partial completion, expiry), a committed version, a replica becoming synced. Pushes are opened, settled and aborted by the
`PushCoordinator` (`asyncrl.push.coordinator`) under this lock; its fan-out runs on its own threads and the commit
waits for the acks *outside* the lock. The policy version is this object's: a push only reports it. The
learner's seat is given and checked by the `LearnerSeating` part (`controller.learner_seat`), new registrations
are challenged by the `ReplicaReachability` part (`controller.reachability`), and silent replicas and due leases
are reaped by the `Liveness` part (`controller.liveness`).

Clocks: `clock` (monotonic seconds, injectable) drives liveness: heartbeats, lease TTLs, push ages. Holding
uses real time (`time.monotonic`) because it is a real wait on a condition variable.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections import deque
from collections.abc import Callable

from asyncrl.controller import staleness
from asyncrl.controller.admission import Admission
from asyncrl.controller.controller_metrics import ControllerMetrics
from asyncrl.controller.errors import PreconditionFailed, ReplicaIdInUse
from asyncrl.controller.learner_seat import LearnerSeat, LearnerSeating, Probe
from asyncrl.controller.leases import LeaseBook
from asyncrl.controller.liveness import Liveness
from asyncrl.controller.persistence import (
    ControllerStore,
    NoStore,
    SavedState,
    StateOfAnotherRun,
    StateWriter,
    restore_books,
)
from asyncrl.controller.reachability import ReachabilityChecks, ReplicaReachability
from asyncrl.controller.reaper import Reaper, StallDetector
from asyncrl.controller.registry import Replica, ReplicaRegistry
from asyncrl.controller.results import (
    CommitResult,
    LearnerFigures,
    LearnerPulse,
    LearnerReport,
    Registration,
    ReplicaPulse,
    TimelineReset,
)
from asyncrl.controller.views import learner_view, replica_view
from asyncrl.core.buffer.lease_writes import LeaseWriteCounts
from asyncrl.core.config import ControllerConfig
from asyncrl.core.events import EventSink, NoEvents
from asyncrl.core.learner_secret import SeatProofs
from asyncrl.push.coordinator import NEW, PushCoordinator, PushTiming
from asyncrl.push.plan import PushOffer
from asyncrl.push.session import PushSession, ReceiverAck, WeightNotifier

_HISTORY = 1000
"""Learner steps the status page's charts keep."""
_REACH_WORKERS = 4
"""Reachability checks in flight at once (one that times out takes the probe's 2 s)."""


class ControllerState(Admission, LearnerSeating, ReplicaReachability, Liveness):
    def __init__(
        self,
        config: ControllerConfig,
        batch_size: int,
        *,
        events: EventSink | None = None,
        metrics: ControllerMetrics | None = None,
        notify: WeightNotifier,
        probe=None,
        learner_probe: Probe | None = None,
        learner_secret: bytes | None = None,
        lease_writes: LeaseWriteCounts | None = None,
        gone: Callable[[str], bool] | None = None,
        store: ControllerStore | None = None,
        run_id: str = "",
        clock=time.monotonic,
        wall_clock=time.time,
    ):
        self.config, self.batch_size, self.eta = config, batch_size, config.eta
        self.events = events or NoEvents()
        self.metrics = metrics or ControllerMetrics()
        self._clock, self._wall = clock, wall_clock
        self._cond = threading.Condition()
        self._registry = ReplicaRegistry(config.heartbeat_timeout_s, config.max_replicas, config.forget_dead_after_s)
        self._leases = LeaseBook(config.lease_ttl_s, config.start_admitted, config.start_prompt_index,
                                 config.lease_max_s)
        self._current_version = config.start_version
        self._reset_to: int | None = None
        """The version the last timeline reset went back to (None: none since this controller started). A
        replica registering with a version above it may hold the lost timeline's weights under a number the
        new timeline reuses: it gets a resync."""
        self._pushes = PushCoordinator(timing=PushTiming(config.push_timeout_s, config.push_backoff_s),
                                       replicas=self._registry, notify=notify, events=self.events,
                                       metrics=self.metrics)
        self._held = 0
        self._last_replica_scan = float("-inf")
        self._wakers: list = []
        self._learner: LearnerReport | None = None
        self._history: deque[dict] = deque(maxlen=_HISTORY)
        """The learner's figures per step (the status page's charts), the last _HISTORY steps."""
        self._reaper: Reaper | None = None
        self._stall: StallDetector | None = None
        """With the reaper running: notices that the controller itself stood still."""
        self._run_id = run_id
        self._probe = probe
        """(address, challenge) -> the replica's answer (b"" when none); None: ids and addresses are never
        checked."""
        self._reach = ReachabilityChecks(self.check_reachable, _REACH_WORKERS) if probe is not None else None
        self._gone = gone
        """address -> True when a connection there is refused (the process is gone); None: never dial."""
        self._gone_checks = ReachabilityChecks(self.check_gone, _REACH_WORKERS) if gone is not None else None
        self._seat = LearnerSeat(learner_probe)
        self._seat_proofs = SeatProofs(learner_secret, wall_clock)
        """Registrations of a learner must prove the learner secret (`asyncrl.core.learner_secret`); None: any
        token holder may register (unit tests, `security.insecure`)."""
        self._lease_writes = lease_writes
        """What reached the buffer under each lease: a completion counts at most that (`Admission.complete`);
        None: the completion's claim stands (unit tests, an in-memory buffer, simulated replicas)."""
        self._writer = StateWriter(store or NoStore())
        self.restored = self._restore(self._writer.store.load())
        self._publish_gauges()
        self.metrics.follow(self.snapshot)

    def close(self) -> None:
        """Stop the reaper, close the event log and the store (idempotent)."""
        if self._reaper is not None:
            self._reaper.stop()
            self._reaper = None
        for checks in (self._reach, self._gone_checks):
            if checks is not None:
                checks.close()
        self.events.close()
        self._writer.store.close()

    # ---- replicas -------------------------------------------------------------------------------------

    def register(self, address: str, replica_id: str, weight_version: int, engine: str,
                 push_key: bytes = b"", in_band: bool = False) -> Registration:
        """Add a replica, or register one again: its own process (it presents its current `push_key`), or a
        new process taking the id over from a holder that is gone (a restart). An id whose holder still proves
        itself alive (`probe`, outside the lock) is refused: one caller cannot redirect another replica's
        pushes to itself."""
        holder = self._live_holder(replica_id)
        if holder is not None and push_key and hmac.compare_digest(push_key, holder.push_key):
            holder = None  # the holder itself
        if holder is not None and self._probe is not None and self._answers(holder.address, holder.push_key):
            raise ReplicaIdInUse(f"replica_id: {replica_id!r} is registered by a live replica at "
                                 f"{holder.address}; choose another id")
        with self._cond:
            self._reap_locked()
            reregistered = bool(replica_id) and self._registry.known(replica_id)
            if reregistered:
                # A restarted replica lost whatever it was generating: its old leases return their quota.
                self._log_expired(self._leases.expire_replica(replica_id, "reregistered"), "reregistered")
            replica = self._registry.register(address, replica_id, weight_version, engine, self._clock(), in_band)
            replica.force_sync = self._reset_to is not None and weight_version > self._reset_to
            if reregistered:
                self._pushes.replica_registered(replica.replica_id)
            self._check_reachability_of(replica)
            needs_sync = replica.needs_sync(self._current_version)
            self.events.write(
                "replica_registered", replica_id=replica.replica_id, address=address,
                weight_version=weight_version, engine=engine, needs_sync=needs_sync,
                current_version=self._current_version, reregistered=reregistered,
            )  # fmt: skip
            self._changed(replicas=True)
            return Registration(replica.replica_id, self._current_version, needs_sync,
                                self.config.heartbeat_interval_s, replica.push_key)

    def _live_holder(self, replica_id: str) -> Replica | None:
        with self._cond:
            self._reap_locked()
            if not replica_id or not self._registry.known(replica_id):
                return None
            replica = self._registry.get(replica_id)
            return replica if replica.alive else None

    def heartbeat(self, replica_id: str, weight_version: int, held_leases: list[str] | None = None) -> ReplicaPulse:
        """A replica's sign of life; `held_leases` (when reported) are the leases it still works on."""
        with self._cond:
            replica = self._registry.get(replica_id)
            lagged = replica.needs_sync(self._current_version)
            # Touch before reaping: a replica that speaks is alive, whatever its silence before.
            revived = self._touch(replica)
            self._reap_locked()
            reported = replica.weight_version
            self._registry.report_version(replica, weight_version)
            held = None if held_leases is None else set(held_leases)
            abandoned = self._leases.extend(replica_id, self._clock(), held, self.config.lease_report_grace_s)
            if abandoned:
                self._log_expired(abandoned, "abandoned")
                self._changed()
            needs_sync = replica.needs_sync(self._current_version)
            # Wake held requests only when this replica's own eligibility may have changed.
            self._changed(wake=revived or lagged != needs_sync, replicas=replica.weight_version != reported)
            held_back_s = max(0.0, replica.held_back_until - self._clock())
            return ReplicaPulse(self._current_version, needs_sync, held_back_s,
                                replica.push_problem if held_back_s else "")

    # ---- weight pushes --------------------------------------------------------------------------------

    def begin_push(self, version: int, offer: PushOffer, unused_push_id: str = "") -> PushSession:
        """Open a push of `version` (current+1: new policy; current: resync) and start its fan-out. A push
        reserved at the last commit is closed (`PushCoordinator.close_reserved`: quietly when `unused_push_id`
        names it)."""
        with self._cond:
            self._reap_locked()
            session = self._pushes.begin(version, self._current_version, offer, self._clock(), unused_push_id)
            self._changed(replicas=True)  # an aborted predecessor flagged its receivers
            return session

    def commit_push(self, push_id: str, sender_ok: bool, error: str = "", missing_ranks: tuple[int, ...] = (),
                    acks: tuple[ReceiverAck, ...] = (), reserve_next: bool = False,
                    learner_seconds: float = 0.0) -> CommitResult:  # fmt: skip
        """Wait (bounded) for the receivers' acks, drop the failed ones, commit the version. A push the sender
        failed is aborted; its receivers that never joined (`missing_ranks`) or could not be reached are held
        back from the next pushes (`Replica.hold_back`), so the retry goes without them. An in-band push's acks
        come with the commit (`acks`, relayed by the learner): nothing to wait for. With `reserve_next`, the
        next push is reserved for the learner when it can go in-band (`CommitResult.next_push`). A reserved
        push is timed from `learner_seconds` (the learner's own measure up to this call): the controller did
        not see it begin."""
        with self._cond:
            session, wait_s = self._pushes.start_commit(push_id, self._clock(), bool(acks), learner_seconds)
            if not sender_ok:
                so_far = session.outcomes_so_far()
                self._pushes.hold_back_failed(session, so_far, self._clock(), missing_ranks, error)
                self._bury_unreachable(so_far)
                self._pushes.abort(session, f"sender failed: {error or 'no detail'}")
                self._changed(replicas=True)
                return CommitResult(False, self._current_version, [], [r.replica_id for r in session.receivers])
        if session.in_band:
            outcomes = session.outcomes_from_acks(list(acks), self._clock() - session.begun_at)
        else:
            outcomes = session.wait(wait_s)  # outside the lock: leases keep flowing meanwhile
        with self._cond:
            acked, dropped = self._pushes.settle(session, outcomes)
            self._pushes.hold_back_failed(session, outcomes, self._clock())
            self._bury_unreachable(outcomes)
            if session.mode == NEW:
                self._current_version = max(self._current_version, session.plan.version)  # versions only grow
            self._pushes.record_commit(session, self._current_version, acked, dropped,
                                       self._clock() - session.begun_at)  # fmt: skip
            reserved = self._pushes.reserve(session, self._current_version, self._clock()) if reserve_next else None
            self._changed(replicas=True)
            return CommitResult(True, self._current_version, acked, dropped, reserved)

    def reset_timeline(self, version: int, admitted: int, prompt_index: int) -> TimelineReset:
        """The learner continues from a checkpoint at `version`, behind the controller (it restarted alone):
        every active lease (admitted on the lost timeline) expires, an open push is aborted, every replica
        needs a resync (its weights may be the lost timeline's), and the version, N_r and the prompt cursor
        (never moved back) start the new timeline."""
        with self._cond:
            self._reap_locked()
            previous = self._current_version
            if version > previous:
                raise PreconditionFailed(f"version: {version} is ahead of the controller's {previous}; a learner "
                                         "ahead of its controller pushes its weights instead")
            self._pushes.abort_held("timeline reset by the learner")
            expired = self._leases.expire_all("timeline_reset")
            self._log_expired(expired, "timeline_reset")
            cursor = self._leases.restart_counts(admitted, prompt_index)
            for replica in self._registry.all():
                replica.force_sync = True
            self._current_version = version
            self._reset_to = version
            self.events.write("timeline_reset", version=version, previous_version=previous, admitted=admitted,
                              prompt_index=cursor, leases_expired=len(expired))  # fmt: skip
            self._changed(replicas=True)
            return TimelineReset(version, len(expired), cursor)

    def learner_heartbeat(self, step: int, version: int, consumed: int,
                          figures: LearnerFigures | None = None) -> LearnerPulse:
        """Record the learner's progress (and, after a step, its figures: the status page's history); ask for
        a resync push when a live replica needs one."""
        with self._cond:
            self._reap_locked()
            now = self._clock()
            # A heartbeat while waiting for data carries no figures: the last step's stay on show.
            shown = figures or (self._learner.progress if self._learner is not None else None)
            self._learner = LearnerReport(step, version, consumed, now, shown)
            if figures is not None and figures.reward_mean is not None and (
                    not self._history or self._history[-1]["step"] != step):
                self._history.append({"step": step, "t": self._wall(), "reward": figures.reward_mean,
                                      "accuracy": figures.eval_accuracy, "staleness": figures.staleness_mean,
                                      "step_s": figures.step_seconds})
            lagging = any(r.needs_sync(self._current_version) for r in self._registry.live() if r.pushable(now))
            return LearnerPulse(lagging and not self._pushes.is_fresh(now), self._current_version)

    # ---- housekeeping and views -----------------------------------------------------------------------

    @property
    def current_version(self) -> int:
        with self._cond:
            return self._current_version

    @property
    def admitted(self) -> int:
        with self._cond:
            return self._leases.admitted

    def snapshot(self) -> dict:
        """Everything the status page, /status and GetStatus show, as plain JSON-able data."""
        with self._cond:
            self._reap_locked()
            now, current = self._clock(), self._current_version
            return {
                "current_version": current,
                "admitted": self._leases.admitted,
                "batch_size": self.batch_size,
                "eta": self.eta,
                "max_admissible": staleness.max_admissible(current, self.batch_size, self.eta),
                "held_requests": self._held,
                "next_prompt_index": self._leases.next_prompt_index,
                "active_leases": len(self._leases.active()),
                "leases_granted": self._leases.granted_total,
                "leases_expired": self._leases.expired_total,
                "pushes_committed": self._pushes.committed,
                "open_push": self._pushes.view(now),
                "reserved_push": self._pushes.view(now, reserved=True),
                "learner": None if self._learner is None else learner_view(self._learner, now, self.batch_size,
                                                                            self._seat.holder.address),
                "history": list(self._history),
                "replicas": [replica_view(r, now, current, len(self._leases.of_replica(r.replica_id)))
                             for r in self._registry.all()],
            }  # fmt: skip

    # ---- internals (call with the lock held) ------------------------------------------------------------

    def _changed(self, wake: bool = True, replicas: bool = False) -> None:
        self._persist(replicas)
        self._publish_gauges()
        if wake:
            self._cond.notify_all()
            for wake_up in self._wakers:
                wake_up()

    # ---- persistence (call with the lock held) -----------------------------------------------------------

    def _persist(self, replicas_changed: bool = False) -> None:
        """Write what changed to the store (one transaction; nothing when unchanged). Replicas are compared
        only when `replicas_changed` says an operation may have changed one (a scan of all of them)."""
        meta = {
            "run_dir": self._run_id, "current_version": self._current_version, "admitted": self._leases.admitted,
            "next_prompt_index": self._leases.next_prompt_index, "granted_total": self._leases.granted_total,
            "expired_total": self._leases.expired_total, "pushes_committed": self._pushes.committed,
            "learner_key": self._seat.holder.key.hex(), "learner_address": self._seat.holder.address,
        }  # fmt: skip
        self._writer.write(meta, self._leases.active_by_id(), self._registry.all() if replicas_changed else None)

    def _restore(self, saved: SavedState | None) -> dict | None:
        """Continue from a saved state (a controller restart); returns what was restored, for the event log."""
        if saved is not None:
            if saved.run_dir != self._run_id:
                raise StateOfAnotherRun(
                    f"controller.state_key: the store holds the controller state of run {saved.run_dir!r}, not "
                    f"{self._run_id!r}; use another controller.state_key, or delete it to start this run afresh"
                )
            self._current_version = saved.current_version
            self._pushes.committed = saved.pushes_committed
            self._seat.restore(saved.learner_key, saved.learner_address)
            restore_books(saved, self._leases, self._registry, self._clock())
            for replica in self._registry.all():
                if not replica.reachable:  # its check died with the previous controller
                    self._check_reachability_of(replica)
        self._persist(replicas_changed=True)  # the baseline of later diffs
        return None if saved is None else saved.summary()

    def _publish_gauges(self) -> None:
        self.metrics.current_version.set(self._current_version)
        self.metrics.admitted_trajectories.set(self._leases.admitted)
        self.metrics.held_requests.set(self._held)
        self.metrics.live_replicas.set(len(self._registry.live()))
