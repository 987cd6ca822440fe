"""Who is alive and what is due: the part of `ControllerState` that declares silent replicas dead, expires due
leases and forgets long-dead replicas (lazily on every operation, and on the reaper's timer in production), and
that does not count the controller's own stall as anybody's silence (a mixin, like `admission.Admission`: it
shares the state's lock, registry, lease book, events and pushes; call the `_` methods with the lock held)."""

from __future__ import annotations

from dataclasses import replace

from asyncrl.controller.leases import Lease
from asyncrl.controller.push import Outcome
from asyncrl.controller.reaper import Reaper, StallDetector
from asyncrl.controller.registry import Replica

STALL_S = 2.0
"""A reap this much later than due means the controller stood still (its reaper is due every second at most)."""
REPLICA_SCAN_S = 0.1
"""Lazy reaping looks for dead replicas at most this often (seconds of the state's clock)."""


class Liveness:
    def start_reaper(self) -> None:
        """Reap on a timer too (production); unit tests rely on the lazy reaping of every operation. With the
        timer, a reap that comes much later than due tells that the controller stood still (`StallDetector`)."""
        cfg = self.config
        reaper = Reaper.for_timeouts(self.reap, cfg.heartbeat_timeout_s, cfg.lease_ttl_s)
        with self._cond:
            self._stall = StallDetector(reaper.interval_s, STALL_S)
        self._reaper = reaper.start()

    def reap(self) -> None:
        """Declare silent replicas dead and expire due leases (the reaper thread calls this)."""
        with self._cond:
            self._reap_locked(full=True)

    def _touch(self, replica: Replica) -> bool:
        revived = self._registry.touch(replica, self._clock())
        if revived:
            self.events.write("replica_revived", replica_id=replica.replica_id)
        return revived

    def _reap_locked(self, full: bool = False) -> None:
        """Expire due leases (every time: cheap, and a late completion must find its lease expired); declare
        silent replicas dead and forget long-dead ones when `full` or at most every REPLICA_SCAN_S (a scan
        of the whole fleet on every call would make each call O(replicas))."""
        if self._stall is not None and (stood_s := self._stall.missed()):
            self.forgive_stall(stood_s)
        now = self._clock()
        changed = False
        scan = full or now - self._last_replica_scan >= REPLICA_SCAN_S
        if scan:
            self._last_replica_scan = now
        for replica in self._registry.reap(now) if scan else ():
            leases = self._leases.expire_replica(replica.replica_id, "replica_dead")
            self.events.write(
                "replica_dead", replica_id=replica.replica_id, silent_s=replica.heartbeat_age(now),
                leases_expired=len(leases),
            )  # fmt: skip
            self._log_expired(leases, "replica_dead")
            # A receiver of the open push that falls silent (a hung process) will not acknowledge it: the
            # commit stops waiting for it instead of waiting out push_timeout_s.
            self._pushes.receiver_died(replica.replica_id, f"declared dead during the push: no heartbeat for "
                                                           f"{replica.heartbeat_age(now):.1f} s")
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

    def forgive_stall(self, seconds: float) -> None:
        """The controller stood still for `seconds` (call with the lock held): nobody could heartbeat or
        complete a lease meanwhile, so every replica's silence, every lease's age and the learner's silence
        are moved on by that much instead of counting against them."""
        now = self._clock()
        for replica in self._registry.all():
            replica.last_heartbeat = min(now, replica.last_heartbeat + seconds)
        self._leases.postpone_all(seconds)
        if self._learner is not None:
            self._learner = replace(self._learner, at=min(now, self._learner.at + seconds))
        self.events.write("controller_stalled", seconds=seconds, replicas=len(self._registry.all()),
                          leases=len(self._leases.active()))  # fmt: skip

    def _bury_unreachable(self, outcomes: dict[str, Outcome]) -> None:
        """A receiver nothing listens for any more is dead now, not after the heartbeat time-out: the retry
        of this push must not pick it again, and its leases return their quota at once. Its next heartbeat
        revives it (it then needs a resync), and it is held back from pushes until its back-off ends
        (`PushCoordinator.hold_back_failed`): a process whose heartbeats arrive but whose address answers
        nothing (a wrong advertised host) must not be in every push."""
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
