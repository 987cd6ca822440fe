"""`ControllerState`: the controller's thread-safe state and operations (no gRPC in here).

One lock, one condition variable (`_cond`) over it. Every operation takes the lock, lazily reaps what is
due (dead replicas, expired leases) so correctness never depends on the reaper thread's timing, mutates,
writes its event records and updates the gauges. Held `AcquireLease` calls wait on `_cond`; everything that
can make a held request admissible calls `notify_all`: returned quota (partial completion, expiry), a
committed version, a replica becoming synced. Pushes are opened, settled and aborted by the
`PushCoordinator` (`controller.push`) under this lock; its fan-out runs on its own threads and the commit
waits for the acks *outside* the lock. The policy version is this object's: a push only reports it.

Clocks: `clock` (monotonic seconds, injectable) drives liveness: heartbeats, lease TTLs, push ages. Holding
uses real time (`time.monotonic`) because it is a real wait on a condition variable.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time

from asyncrl.controller import staleness
from asyncrl.controller.controller_metrics import ControllerMetrics
from asyncrl.controller.errors import InvalidRequest, ReplicaIdInUse
from asyncrl.controller.event_records import EventSink, NoEvents
from asyncrl.controller.leases import Lease, LeaseBook
from asyncrl.controller.persistence import ControllerStore, NoStore, SavedState, StateWriter
from asyncrl.controller.push import NEW, Outcome, PushCoordinator, PushOffer, PushSession, WeightNotifier
from asyncrl.controller.reaper import Reaper
from asyncrl.controller.registry import Replica, ReplicaRegistry
from asyncrl.controller.results import (
    CommitResult,
    LearnerPulse,
    LearnerReport,
    LeaseDecision,
    Registration,
    ReplicaPulse,
)
from asyncrl.core.auth import liveness_mac
from asyncrl.core.config import ControllerConfig
from asyncrl.core.preflight import ConfigError


class StateOfAnotherRun(ConfigError):
    """The store holds the state of another run (its run_dir differs)."""


_REPLICA_SCAN_S = 0.1
"""Lazy reaping looks for dead replicas at most this often (seconds of the state's clock)."""

# A held request re-checks at least this often, so an expiry found by lazy reaping (no reaper thread in
# unit tests) still releases it.
_HOLD_POLL_S = 0.25


class ControllerState:
    def __init__(
        self,
        config: ControllerConfig,
        batch_size: int,
        *,
        events: EventSink | None = None,
        metrics: ControllerMetrics | None = None,
        notify: WeightNotifier,
        probe=None,
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
        self._leases = LeaseBook(config.lease_ttl_s, config.start_admitted, config.start_prompt_index)
        self._current_version = config.start_version
        self._pushes = PushCoordinator(config, self._registry, notify, self.events, self.metrics)
        self._held = 0
        self._last_replica_scan = float("-inf")
        self._wakers: list = []
        self._learner: LearnerReport | None = None
        self._reaper: Reaper | None = None
        self._run_id = run_id
        self._probe = probe
        """(address, challenge) -> the replica's answer (b"" when none); None: ids are never checked."""
        self._writer = StateWriter(store or NoStore())
        self.restored = self._restore(self._writer.store.load())
        self._publish_gauges()

    def start_reaper(self) -> None:
        """Reap on a timer too (production); unit tests rely on the lazy reaping of every operation."""
        cfg = self.config
        self._reaper = Reaper.for_timeouts(self.reap, cfg.heartbeat_timeout_s, cfg.lease_ttl_s).start()

    def close(self) -> None:
        """Stop the reaper, close the event log and the store (idempotent)."""
        if self._reaper is not None:
            self._reaper.stop()
            self._reaper = None
        self.events.close()
        self._writer.store.close()

    # ---- replicas -------------------------------------------------------------------------------------

    def register(self, address: str, replica_id: str, weight_version: int, engine: str,
                 push_key: bytes = b"") -> Registration:
        """Add a replica, or register one again: its own process (it presents its current `push_key`), or a
        new process taking the id over from a holder that is gone (a restart). An id whose holder still proves
        itself alive (`probe`, outside the lock) is refused: one caller cannot redirect another replica's
        pushes to itself."""
        holder = self._live_holder(replica_id)
        if holder is not None and push_key and hmac.compare_digest(push_key, holder.push_key):
            holder = None  # the holder itself
        if holder is not None and self._probe is not None:
            challenge = secrets.token_bytes(32)
            if hmac.compare_digest(self._probe(holder.address, challenge), liveness_mac(holder.push_key, challenge)):
                raise ReplicaIdInUse(f"replica_id: {replica_id!r} is registered by a live replica at "
                                     f"{holder.address}; choose another id")
        with self._cond:
            self._reap_locked()
            reregistered = bool(replica_id) and self._registry.known(replica_id)
            if reregistered:
                # A restarted replica lost whatever it was generating: its old leases return their quota.
                self._log_expired(self._leases.expire_replica(replica_id, "reregistered"), "reregistered")
            replica = self._registry.register(address, replica_id, weight_version, engine, self._clock())
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
            return ReplicaPulse(self._current_version, needs_sync)

    # ---- leases ---------------------------------------------------------------------------------------

    def acquire(self, replica_id: str, num_trajectories: int, wait_s: float) -> LeaseDecision:
        """Grant a lease now, or hold (this thread) up to min(wait_s, max_hold_s) until it becomes admissible.
        The gRPC edge holds without a thread: `try_acquire` on every wake-up (`add_waker`)."""
        started = time.monotonic()
        deadline = started + self.hold_limit(wait_s)
        held = False
        with self._cond:
            replica = self._registry.get(replica_id)
            try:
                self._reap_locked()
                self._touch(replica)
                while True:
                    decision = self._decide(replica, num_trajectories, started, time.monotonic() >= deadline)
                    if decision is not None:
                        return decision
                    if not held:
                        held = True
                        self._count_held(+1)
                    self._cond.wait(min(deadline - time.monotonic(), _HOLD_POLL_S))
                    self._touch(replica)  # a replica waiting in AcquireLease is evidently alive
                    self._reap_locked()
            finally:
                if held:
                    self._count_held(-1)
                self.metrics.lease_hold_seconds.observe(time.monotonic() - started)

    def try_acquire(self, replica_id: str, num_trajectories: int, started: float, final: bool) -> LeaseDecision | None:
        """One look at a lease request, never waiting: a grant; a refusal with its reason when `final`; else None
        (the caller holds the request and asks again when woken). `started`: when the request arrived
        (time.monotonic), for the hold time."""
        with self._cond:
            replica = self._registry.get(replica_id)
            self._reap_locked()
            self._touch(replica)  # a replica waiting in AcquireLease is evidently alive
            return self._decide(replica, num_trajectories, started, final)

    def hold_limit(self, wait_s: float) -> float:
        """How long a request asking to wait `wait_s` is held at most."""
        return min(max(wait_s, 0.0), self.config.max_hold_s)

    def holding(self, started: float | None) -> None:
        """Count a request the caller starts holding (`started` None) or stopped holding (when it arrived)."""
        with self._cond:
            self._count_held(+1 if started is None else -1)
        if started is not None:
            self.metrics.lease_hold_seconds.observe(time.monotonic() - started)

    def add_waker(self, wake) -> None:
        """Call `wake()` (from any thread, under the lock: it must only schedule) whenever a held request may
        have become admissible."""
        with self._cond:
            self._wakers.append(wake)

    def complete(self, replica_id: str, lease_id: str, num_written: int) -> int:
        """Close a lease; the unwritten part of its quota returns. Returns the quota returned."""
        with self._cond:
            replica = self._registry.get(replica_id)
            self._reap_locked()  # first: a lease past its expiry is expired, whatever the reaper's timing
            self._touch(replica)
            lease, returned = self._leases.complete(replica_id, lease_id, num_written)
            self.events.write(
                "lease_completed", lease_id=lease_id, replica_id=replica_id, n=lease.num_trajectories,
                num_written=num_written, returned=returned, admitted_after=self._leases.admitted,
            )  # fmt: skip
            self._changed(wake=returned > 0)
            return returned

    # ---- weight pushes --------------------------------------------------------------------------------

    def begin_push(self, version: int, offer: PushOffer) -> PushSession:
        """Open a push of `version` (current+1: new policy; current: resync) and start its fan-out."""
        with self._cond:
            self._reap_locked()
            session = self._pushes.begin(version, self._current_version, offer, self._clock())
            self._changed(replicas=True)  # an aborted predecessor flagged its receivers
            return session

    def commit_push(self, push_id: str, sender_ok: bool, error: str = "") -> CommitResult:
        """Wait (bounded) for the receivers' acks, drop the failed ones, commit the version."""
        with self._cond:
            session, wait_s = self._pushes.start_commit(push_id, self._clock())
            if not sender_ok:
                self._bury_unreachable(session.outcomes_so_far())
                self._pushes.abort(session, f"sender failed: {error or 'no detail'}")
                self._changed(replicas=True)
                return CommitResult(False, self._current_version, [], [r.replica_id for r in session.receivers])
        outcomes = session.wait(wait_s)  # outside the lock: leases keep flowing meanwhile
        with self._cond:
            acked, dropped = self._pushes.settle(session, outcomes)
            self._bury_unreachable(outcomes)
            if session.mode == NEW:
                self._current_version = max(self._current_version, session.plan.version)  # versions only grow
            self._pushes.record_commit(session, self._current_version, acked, dropped,
                                       self._clock() - session.begun_at)  # fmt: skip
            self._changed(replicas=True)
            return CommitResult(True, self._current_version, acked, dropped)

    def learner_heartbeat(self, step: int, version: int, consumed: int) -> LearnerPulse:
        """Record the learner's progress; ask for a resync push when a live replica needs one."""
        with self._cond:
            self._reap_locked()
            now = self._clock()
            self._learner = LearnerReport(step, version, consumed, now)
            lagging = any(r.needs_sync(self._current_version) for r in self._registry.live())
            return LearnerPulse(lagging and not self._pushes.is_fresh(now), self._current_version)

    # ---- housekeeping and views -----------------------------------------------------------------------

    def reap(self) -> None:
        """Declare silent replicas dead and expire due leases (the reaper thread calls this)."""
        with self._cond:
            self._reap_locked(full=True)

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
                "learner": None if self._learner is None else {
                    "step": self._learner.step, "version": self._learner.version,
                    "consumed": self._learner.consumed, "heartbeat_age_s": now - self._learner.at,
                },
                "replicas": [self._replica_view(r, now, current) for r in self._registry.all()],
            }  # fmt: skip

    # ---- internals (call with the lock held) ------------------------------------------------------------

    def _decide(self, replica: Replica, n: int, started: float, final: bool) -> LeaseDecision | None:
        if n > self.batch_size:
            # Larger than B could starve forever under η = 0; one lease is one group and G divides B.
            raise InvalidRequest("num_trajectories", f"must be <= batch_size ({self.batch_size}), got {n}")
        reason = self._refusal(replica, n)
        held_s = time.monotonic() - started
        if reason is None:
            return self._grant(replica, n, held_s)
        if final:
            return LeaseDecision(False, self._current_version, reason=reason, held_s=held_s)
        return None

    def _count_held(self, delta: int) -> None:
        self._held += delta
        self.metrics.held_requests.set(self._held)

    def _refusal(self, replica: Replica, n: int) -> str | None:
        """Why a lease of n for this replica cannot be granted now (None = it can)."""
        current = self._current_version
        if not replica.alive:
            return f"replica {replica.replica_id!r} was declared dead; register again"
        if replica.needs_sync(current):
            why = (
                "its last push failed" if replica.force_sync else f"it holds version {replica.weight_version}"
            )
            return f"replica needs a weight sync to version {current} ({why})"
        if not staleness.admissible(self._leases.admitted, n, self.batch_size, current, self.eta):
            limit = staleness.max_admissible(current, self.batch_size, self.eta)
            return (
                f"staleness bound: N_r would reach {self._leases.admitted + n} > (i+eta+1)*B = {limit} "
                f"(i={current}, eta={self.eta}, B={self.batch_size}); waiting for version {current + 1}"
            )
        return None

    def _grant(self, replica: Replica, n: int, held_s: float) -> LeaseDecision:
        now = self._clock()
        lease = self._leases.grant(replica.replica_id, n, self._current_version, now)
        self._persist()  # before the answer (and its event): a restart must know every lease it granted
        self.events.write(
            "lease_granted", lease_id=lease.lease_id, replica_id=replica.replica_id, n=n,
            admitted_after=self._leases.admitted, version=lease.version, eta=self.eta,
            batch_size=self.batch_size, prompt_index=lease.prompt_index, held_s=held_s,
        )  # fmt: skip
        self.metrics.leases_granted.inc()
        self._publish_gauges()
        expires_unix_s = self._wall() + (lease.expires_at - now)
        return LeaseDecision(
            True, lease.version, lease.lease_id, lease.prompt_index, expires_unix_s, "", held_s
        )

    def _touch(self, replica: Replica) -> bool:
        revived = self._registry.touch(replica, self._clock())
        if revived:
            self.events.write("replica_revived", replica_id=replica.replica_id)
        return revived

    def _reap_locked(self, full: bool = False) -> None:
        """Expire due leases (every time: cheap, and a late completion must find its lease expired); declare
        silent replicas dead and forget long-dead ones when `full` or at most every _REPLICA_SCAN_S (a scan
        of the whole fleet on every call would make each call O(replicas))."""
        now = self._clock()
        changed = False
        scan = full or now - self._last_replica_scan >= _REPLICA_SCAN_S
        if scan:
            self._last_replica_scan = now
        for replica in self._registry.reap(now) if scan else ():
            leases = self._leases.expire_replica(replica.replica_id, "replica_dead")
            self.events.write(
                "replica_dead", replica_id=replica.replica_id, silent_s=replica.heartbeat_age(now),
                leases_expired=len(leases),
            )  # fmt: skip
            self._log_expired(leases, "replica_dead")
            changed = True
        for replica in self._registry.forget(now) if scan else ():
            self.events.write("replica_forgotten", replica_id=replica.replica_id, silent_s=replica.heartbeat_age(now))
            changed = True
        due = self._leases.expire_due(now)
        if due:
            self._log_expired(due, "ttl")
            changed = True
        if changed:
            self._changed(replicas=True)

    def _bury_unreachable(self, outcomes: dict[str, Outcome]) -> None:
        """A receiver nothing listens for any more is dead now, not after the heartbeat time-out: the retry
        of this push must not pick it again, and its leases return their quota at once. If it was only
        unreachable for a moment, its next heartbeat revives it (it then needs a resync)."""
        for replica_id, outcome in outcomes.items():
            replica = self._registry.get(replica_id)
            if not outcome.unreachable or not replica.alive:
                continue
            replica.alive = False
            leases = self._leases.expire_replica(replica_id, "unreachable")
            self.events.write(
                "replica_dead", replica_id=replica_id, silent_s=replica.heartbeat_age(self._clock()),
                leases_expired=len(leases), reason="unreachable",
            )  # fmt: skip
            self._log_expired(leases, "unreachable")

    def _log_expired(self, leases: list[Lease], reason: str) -> None:
        after = self._leases.admitted + sum(lease.num_trajectories for lease in leases)
        for lease in leases:
            after -= lease.num_trajectories
            self.events.write(
                "lease_expired", lease_id=lease.lease_id, replica_id=lease.replica_id, n=lease.num_trajectories,
                returned=lease.num_trajectories, admitted_after=after, reason=reason,
            )  # fmt: skip
        self.metrics.leases_expired.inc(len(leases))

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
        }  # fmt: skip
        self._writer.write(meta, self._leases.active_by_id(), self._registry.all() if replicas_changed else None)

    def _restore(self, saved: SavedState | None) -> dict | None:
        """Continue from a saved state (a controller restart); returns what was restored, for the event log."""
        if saved is None:
            self._persist(replicas_changed=True)
            return None
        if saved.run_dir != self._run_id:
            raise StateOfAnotherRun(
                f"controller.state_key: the store holds the controller state of run {saved.run_dir!r}, not "
                f"{self._run_id!r}; use another controller.state_key, or delete it to start this run afresh"
            )
        now = self._clock()
        self._current_version = saved.current_version
        self._pushes.committed = saved.pushes_committed
        self._leases.restore(saved.admitted, saved.next_prompt_index, saved.granted_total, saved.expired_total,
                             [Lease(x.lease_id, x.replica_id, x.num_trajectories, x.prompt_index, x.version,
                                    granted_at=now, expires_at=now + self.config.lease_ttl_s)
                              for x in saved.leases])  # fmt: skip
        for r in saved.replicas:
            self._registry.restore(Replica(r.replica_id, r.address, r.weight_version, r.engine, registered_at=now,
                                           last_heartbeat=now, push_key=r.push_key, force_sync=r.force_sync))
        self._persist(replicas_changed=True)  # the baseline of later diffs
        return {"version": saved.current_version, "admitted": saved.admitted,
                "next_prompt_index": saved.next_prompt_index, "leases": len(saved.leases),
                "replicas": len(saved.replicas)}

    def _publish_gauges(self) -> None:
        self.metrics.current_version.set(self._current_version)
        self.metrics.admitted_trajectories.set(self._leases.admitted)
        self.metrics.held_requests.set(self._held)
        self.metrics.live_replicas.set(len(self._registry.live()))

    def _replica_view(self, replica: Replica, now: float, current: int) -> dict:
        return {
            "replica_id": replica.replica_id,
            "address": replica.address,
            "weight_version": replica.weight_version,
            "alive": replica.alive,
            "needs_sync": replica.needs_sync(current),
            "active_leases": len(self._leases.of_replica(replica.replica_id)),
            "last_heartbeat_age_s": replica.heartbeat_age(now),
            "engine": replica.engine,
        }
