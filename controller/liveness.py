"""Who is alive and what is due: the part of `ControllerState` that declares silent replicas dead, expires due
leases and forgets long-dead replicas (lazily on every operation, and on the reaper's timer in production), and
that does not count the controller's own stall as anybody's silence (a mixin, like `admission.Admission`: it
shares the state's lock, registry, lease book, events and pushes; call the `_` methods with the lock held).

A replica is declared dead when it is silent past `heartbeat_timeout_s`, or sooner when its process is
shown gone: a push's order found nothing listening at its address (`_bury_unreachable`), or, for a silent
lease holder, a dial of its address was refused (`check_gone`; `controller.dial_silent_after_s`). The
leases of a dead replica expire and return their quota; with a small η the other replicas are waiting for
exactly that quota, so the earlier it returns the shorter the learner's stall. Heartbeats keep a live
replica's leases alive, but not past `controller.lease_max_s`: a lease that old expires however alive its
holder looks.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import replace

from asyncrl.controller.leases import Lease
from asyncrl.controller.reaper import Reaper, StallDetector
from asyncrl.controller.registry import Replica
from asyncrl.push.session import Outcome

log = logging.getLogger(__name__)

STALL_S = 2.0
"""A reap this much later than due means the controller stood still (its reaper is due every second at most)."""
REPLICA_SCAN_S = 0.1
"""Lazy reaping looks for dead replicas at most this often (seconds of the state's clock)."""


class Liveness:
    def start_reaper(self) -> None:
        """Reap on a timer too (production); unit tests rely on the lazy reaping of every operation. With the
        timer, a reap that comes much later than due tells that the controller stood still (`StallDetector`)."""
        cfg = self.config
        reaper = Reaper.for_timeouts(self.reap, cfg.heartbeat_timeout_s, cfg.lease_ttl_s, cfg.lease_max_s)
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
        if scan:
            self._dial_silent_lease_holders(now)
        due = self._leases.expire_due(now)
        for why in sorted({why for _lease, why in due}):
            leases = [lease for lease, reason in due if reason == why]
            if why == "max_age":
                log.warning("leases %s reached controller.lease_max_s (%g s) still open: their quota returns",
                            [lease.lease_id for lease in leases], self._leases.lease_max_s)
            self._log_expired(leases, why)
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

    def _dial_silent_lease_holders(self, now: float) -> None:
        """Queue a dial of every lease holder silent for `dial_silent_after_s` that answered at its address
        before (`reachable`; an address that never answered says nothing when it refuses), at most once per
        that interval each (`check_gone` runs it off the lock)."""
        after = self.config.dial_silent_after_s
        if self._gone_checks is None or after <= 0:
            return
        # The fleet, not the leases: this runs with every scan, and silence is the cheap test that is rarely
        # true (the lease book is looked at only for a silent replica).
        for replica in self._registry.live():
            if (replica.reachable and replica.heartbeat_age(now) >= after and now - replica.dialled_at >= after
                    and self._leases.of_replica(replica.replica_id)):
                replica.dialled_at = now
                self._gone_checks.submit(replica.replica_id, replica.push_key, 0.0)

    def _silent_holder(self, replica_id: str, key: bytes) -> Replica | None:
        """The live registration `key` of `replica_id` if it is still silent past `dial_silent_after_s`."""
        if not self._registry.known(replica_id):
            return None
        replica = self._registry.get(replica_id)
        if not (replica.alive and hmac.compare_digest(replica.push_key, key)):
            return None
        return replica if replica.heartbeat_age(self._clock()) >= self.config.dial_silent_after_s else None

    def check_gone(self, replica_id: str, key: bytes) -> None:
        """Dial the address of a silent lease holder (outside the lock): refused, its process is gone, and it
        is declared dead now (reason "gone"). One dial per call: `ReachabilityChecks` never repeats it (None)."""
        with self._cond:
            replica = self._silent_holder(replica_id, key)
            if replica is None:
                return
            address = replica.address
        if not self._gone(address):
            return
        with self._cond:
            replica = self._silent_holder(replica_id, key)  # a heartbeat or a new registration meanwhile wins
            if replica is not None:
                self._declare_dead(replica, "gone", f"its process is gone: the controller's dial of {address} "
                                                    "was refused")
                self._changed(replicas=True)

    def _declare_dead(self, replica: Replica, reason: str, problem: str) -> None:
        """`replica` is dead before its heartbeat time-out: its leases expire now, and an open push stops
        waiting for it. Its next heartbeat revives it (it then needs a resync)."""
        replica.alive, replica.dead_reason = False, problem
        leases = self._leases.expire_replica(replica.replica_id, reason)
        self.events.write(
            "replica_dead", replica_id=replica.replica_id, silent_s=replica.heartbeat_age(self._clock()),
            leases_expired=len(leases), reason=reason,
        )  # fmt: skip
        self._log_expired(leases, reason)
        self._pushes.receiver_died(replica.replica_id, problem)

    def _bury_unreachable(self, outcomes: dict[str, Outcome]) -> None:
        """A receiver nothing listens for any more is dead now, not after the heartbeat time-out: the retry
        of this push must not pick it again, and its leases return their quota at once. Its next heartbeat
        revives it (it then needs a resync), and it is held back from pushes until its back-off ends
        (`PushCoordinator.hold_back_failed`): a process whose heartbeats arrive but whose address answers
        nothing (a wrong advertised host) must not be in every push."""
        for replica_id, outcome in outcomes.items():
            replica = self._registry.get(replica_id)
            if outcome.unreachable and replica.alive:
                self._declare_dead(replica, "unreachable", outcome.error)

    def _log_expired(self, leases: list[Lease], reason: str) -> None:
        after = self._leases.admitted + sum(lease.num_trajectories for lease in leases)
        for lease in leases:
            after -= lease.num_trajectories
            self.events.write(
                "lease_expired", lease_id=lease.lease_id, replica_id=lease.replica_id, n=lease.num_trajectories,
                returned=lease.num_trajectories, admitted_after=after, reason=reason,
            )  # fmt: skip
        self.metrics.leases_expired.inc(len(leases))
