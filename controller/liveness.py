"""Who is alive and what is due: the part of `ControllerState` that declares silent replicas dead, expires due
leases and forgets long-dead replicas (lazily on every operation, and on the reaper's timer in production), and
that does not count the controller's own stall as anybody's silence. It works on the state's books
(`controller.books`); call the `*_locked` methods, `touch`, `bury_unreachable` and `log_expired` with the lock
held.

A replica is declared dead when it is silent past `heartbeat_timeout_s`, or sooner when its process is
shown gone: a push's order found nothing listening at its address (`bury_unreachable`), or, for a silent
lease holder, a dial of its address was refused (`check_gone`; `controller.dial_silent_after_s`). The
leases of a dead replica expire and return their quota; with a small η the other replicas are waiting for
exactly that quota, so the earlier it returns the shorter the learner's stall. Heartbeats keep a live
replica's leases alive, but not past `controller.lease_max_s`: a lease that old expires however alive its
holder looks.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from dataclasses import replace

from asyncrl.controller.books import StateBooks
from asyncrl.controller.leases import Lease
from asyncrl.controller.reachability import ReachabilityChecks
from asyncrl.controller.reaper import Reaper, StallDetector
from asyncrl.controller.registry import Replica
from asyncrl.core.records.controller import (
    ControllerStalled,
    LeaseExpired,
    ReplicaDead,
    ReplicaForgotten,
    ReplicaRevived,
)
from asyncrl.push.session import Outcome

log = logging.getLogger(__name__)

STALL_S = 2.0
"""A reap this much later than due means the controller stood still (its reaper is due every second at most)."""
REPLICA_SCAN_S = 0.1
"""Lazy reaping looks for dead replicas at most this often (seconds of the state's clock)."""


class Liveness:
    def __init__(self, books: StateBooks, gone: Callable[[str], bool] | None, workers: int):
        self._books = books
        self._gone = gone
        """address -> True when a connection there is refused (the process is gone); None: never dial."""
        self._gone_checks = ReachabilityChecks(self.check_gone, workers) if gone is not None else None
        self._reaper: Reaper | None = None
        self._stall: StallDetector | None = None
        """With the reaper running: notices that the controller itself stood still."""
        self._last_replica_scan = float("-inf")

    def close(self) -> None:
        """Stop the reaper and the dials (idempotent)."""
        if self._reaper is not None:
            self._reaper.stop()
            self._reaper = None
        if self._gone_checks is not None:
            self._gone_checks.close()

    def start_reaper(self) -> None:
        """Reap on a timer too (production); unit tests rely on the lazy reaping of every operation. With the
        timer, a reap that comes much later than due tells that the controller stood still (`StallDetector`)."""
        cfg = self._books.config
        reaper = Reaper.for_timeouts(self.reap, cfg.heartbeat_timeout_s, cfg.lease_ttl_s, cfg.lease_max_s)
        self.watch_stalls(StallDetector(reaper.interval_s, STALL_S))
        self._reaper = reaper.start()

    def watch_stalls(self, detector: StallDetector) -> None:
        """Forgive the stalls `detector` notices (`start_reaper` sets one on the reaper's interval)."""
        with self._books.cond:
            self._stall = detector

    def queue_dials_on(self, queue: ReachabilityChecks) -> None:
        """Queue the dials of silent lease holders on `queue` instead (anything with `submit` and `close`: a
        test runs them itself); the current queue is closed."""
        if self._gone_checks is not None:
            self._gone_checks.close()
        self._gone_checks = queue

    def reap(self) -> None:
        """Declare silent replicas dead and expire due leases (the reaper thread calls this)."""
        with self._books.cond:
            self.reap_locked(full=True)

    def touch(self, replica: Replica) -> bool:
        books = self._books
        revived = books.registry.touch(replica, books.clock())
        if revived:
            books.events.write(ReplicaRevived(replica_id=replica.replica_id))
        return revived

    def reap_locked(self, full: bool = False) -> None:
        """Expire due leases (every time: cheap, and a late completion must find its lease expired); declare
        silent replicas dead and forget long-dead ones when `full` or at most every REPLICA_SCAN_S (a scan
        of the whole fleet on every call would make each call O(replicas))."""
        books = self._books
        if self._stall is not None and (stood_s := self._stall.missed()):
            self.forgive_stall(stood_s)
        now = books.clock()
        changed = False
        scan = full or now - self._last_replica_scan >= REPLICA_SCAN_S
        if scan:
            self._last_replica_scan = now
        for replica in books.registry.reap(now) if scan else ():
            leases = books.leases.expire_replica(replica.replica_id, "replica_dead")
            books.events.write(ReplicaDead(replica_id=replica.replica_id, silent_s=replica.heartbeat_age(now),
                                           leases_expired=len(leases)))  # fmt: skip
            self.log_expired(leases, "replica_dead")
            # A receiver of the open push that falls silent (a hung process) will not acknowledge it: the
            # commit stops waiting for it instead of waiting out push_timeout_s.
            books.pushes.receiver_died(replica.replica_id, f"declared dead during the push: no heartbeat for "
                                                           f"{replica.heartbeat_age(now):.1f} s")
            changed = True
        for replica in books.registry.forget(now) if scan else ():
            books.events.write(ReplicaForgotten(replica_id=replica.replica_id, silent_s=replica.heartbeat_age(now)))
            changed = True
        if scan:
            self._dial_silent_lease_holders(now)
        due = books.leases.expire_due(now)
        for why in sorted({why for _lease, why in due}):
            leases = [lease for lease, reason in due if reason == why]
            if why == "max_age":
                log.warning("leases %s reached controller.lease_max_s (%g s) still open: their quota returns",
                            [lease.lease_id for lease in leases], books.leases.lease_max_s)
            self.log_expired(leases, why)
            changed = True
        if changed:
            books.changed(replicas=True)

    def forgive_stall(self, seconds: float) -> None:
        """The controller stood still for `seconds` (call with the lock held): nobody could heartbeat or
        complete a lease meanwhile, so every replica's silence, every lease's age and the learner's silence
        are moved on by that much instead of counting against them."""
        books = self._books
        now = books.clock()
        for replica in books.registry.all():
            replica.last_heartbeat = min(now, replica.last_heartbeat + seconds)
        books.leases.postpone_all(seconds)
        if books.learner is not None:
            books.learner = replace(books.learner, at=min(now, books.learner.at + seconds))
        books.events.write(ControllerStalled(seconds=seconds, replicas=len(books.registry.all()),
                                             leases=len(books.leases.active())))  # fmt: skip

    def _dial_silent_lease_holders(self, now: float) -> None:
        """Queue a dial of every lease holder silent for `dial_silent_after_s` that answered at its address
        before (`reachable`; an address that never answered says nothing when it refuses), at most once per
        that interval each (`check_gone` runs it off the lock)."""
        books = self._books
        after = books.config.dial_silent_after_s
        if self._gone_checks is None or after <= 0:
            return
        # The fleet, not the leases: this runs with every scan, and silence is the cheap test that is rarely
        # true (the lease book is looked at only for a silent replica).
        for replica in books.registry.live():
            if (replica.reachable and replica.heartbeat_age(now) >= after and now - replica.dialled_at >= after
                    and books.leases.of_replica(replica.replica_id)):
                replica.dialled_at = now
                self._gone_checks.submit(replica.replica_id, replica.push_key, 0.0)

    def _silent_holder(self, replica_id: str, key: bytes) -> Replica | None:
        """The live registration `key` of `replica_id` if it is still silent past `dial_silent_after_s`."""
        books = self._books
        if not books.registry.known(replica_id):
            return None
        replica = books.registry.get(replica_id)
        if not (replica.alive and hmac.compare_digest(replica.push_key, key)):
            return None
        return replica if replica.heartbeat_age(books.clock()) >= books.config.dial_silent_after_s else None

    def check_gone(self, replica_id: str, key: bytes) -> None:
        """Dial the address of a silent lease holder (outside the lock): refused, its process is gone, and it
        is declared dead now (reason "gone"). One dial per call: `ReachabilityChecks` never repeats it (None)."""
        books = self._books
        with books.cond:
            replica = self._silent_holder(replica_id, key)
            if replica is None:
                return
            address = replica.address
        if not self._gone(address):
            return
        with books.cond:
            replica = self._silent_holder(replica_id, key)  # a heartbeat or a new registration meanwhile wins
            if replica is not None:
                self._declare_dead(replica, "gone", f"its process is gone: the controller's dial of {address} "
                                                    "was refused")
                books.changed(replicas=True)

    def _declare_dead(self, replica: Replica, reason: str, problem: str) -> None:
        """`replica` is dead before its heartbeat time-out: its leases expire now, and an open push stops
        waiting for it. Its next heartbeat revives it (it then needs a resync)."""
        books = self._books
        replica.alive, replica.dead_reason = False, problem
        leases = books.leases.expire_replica(replica.replica_id, reason)
        books.events.write(ReplicaDead(replica_id=replica.replica_id, silent_s=replica.heartbeat_age(books.clock()),
                                       leases_expired=len(leases), reason=reason))  # fmt: skip
        self.log_expired(leases, reason)
        books.pushes.receiver_died(replica.replica_id, problem)

    def bury_unreachable(self, outcomes: dict[str, Outcome]) -> None:
        """A receiver nothing listens for any more is dead now, not after the heartbeat time-out: the retry
        of this push must not pick it again, and its leases return their quota at once. Its next heartbeat
        revives it (it then needs a resync), and it is held back from pushes until its back-off ends
        (`PushCoordinator.hold_back_failed`): a process whose heartbeats arrive but whose address answers
        nothing (a wrong advertised host) must not be in every push."""
        for replica_id, outcome in outcomes.items():
            replica = self._books.registry.get(replica_id)
            if outcome.unreachable and replica.alive:
                self._declare_dead(replica, "unreachable", outcome.error)

    def log_expired(self, leases: list[Lease], reason: str) -> None:
        books = self._books
        after = books.leases.admitted + sum(lease.num_trajectories for lease in leases)
        for lease in leases:
            after -= lease.num_trajectories
            books.events.write(LeaseExpired(
                lease_id=lease.lease_id, replica_id=lease.replica_id, n=lease.num_trajectories,
                returned=lease.num_trajectories, admitted_after=after, reason=reason,
            ))  # fmt: skip
        books.metrics.leases_expired.inc(len(leases))
