"""Reachability checks of new registrations, off the callers' threads.

`RegisterReplica` is open to every holder of the run's token, and the address it names is only a claim. A
weight push waits (`join_timeout_s`) for every receiver it picked, so a receiver nobody answers for stalls
the learner, and three such pushes in a row used to end its run: one wrong `rollout.advertise_host`, or a
token holder registering a fresh unreachable address every few seconds, was enough. So a replica joins
pushes only after the controller has challenged it at its address (`Rollout.GetStatus`) and it answered
under its registration's key (`ReplicaReachability.check_reachable`). Leases do not wait for this: a replica
that registered with the current weights generates at once.

`ReplicaReachability` is the part of the state that checks (`check_reachable`); `ReachabilityChecks` runs
the checks: a scheduler thread hands each due one to a small pool (a check of an address that swallows
packets takes the probe's whole time-out), and a check that asks for another is scheduled again after the
delay it returns.
"""

from __future__ import annotations

import heapq
import hmac
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from asyncrl.controller.books import StateBooks
from asyncrl.controller.learner_seat import Probe
from asyncrl.controller.registry import Replica
from asyncrl.core.records.controller import ReplicaHeldBack, ReplicaReachable
from asyncrl.core.wire.auth import answers_challenge

log = logging.getLogger(__name__)

Check = Callable[[str, bytes], "float | None"]
"""(replica id, registration key) -> seconds until the next check of it, or None when settled."""


class ReachabilityChecks:
    def __init__(self, check: Check, workers: int):
        self._check = check
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="reachability")
        self._due: list[tuple[float, int, str, bytes]] = []  # (when, tie-breaker, replica id, key): a heap
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._schedule, name="reachability-scheduler", daemon=True)
        self._thread.start()

    def submit(self, replica_id: str, key: bytes, delay_s: float) -> None:
        """Check the registration `key` of `replica_id` in `delay_s` seconds."""
        with self._cond:
            heapq.heappush(self._due, (time.monotonic() + delay_s, next(self._order), replica_id, key))
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _schedule(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._due or self._due[0][0] > time.monotonic()):
                    self._cond.wait(self._due[0][0] - time.monotonic() if self._due else None)
                if self._closed:
                    return
                _, _, replica_id, key = heapq.heappop(self._due)
            try:
                self._pool.submit(self._run, replica_id, key)
            except RuntimeError:  # the pool shut down meanwhile
                return

    def _run(self, replica_id: str, key: bytes) -> None:
        try:
            again = self._check(replica_id, key)
        except Exception:  # a check must never end the scheduler; try again later
            log.exception("reachability check of %s failed", replica_id)
            again = 1.0
        if again is not None:
            with self._cond:
                if self._closed:
                    return
            self.submit(replica_id, key, again)


QUICK_RETRIES_S = (0.25, 0.5, 1.0)
"""Delays of the checks after the first ones that fail before a replica is held back: the first challenge
can reach the replica before it has read its registration's key from the answer."""
FIRST_CHECK_S = 0.05


class ReplicaReachability:
    """The part of `ControllerState` that challenges new registrations; it works on the state's books
    (`controller.books`)."""

    def __init__(self, books: StateBooks, probe: Probe | None, workers: int):
        self._books = books
        self._probe = probe
        """(address, challenge) -> the replica's answer (b"" when none); None: ids and addresses are never
        checked, every registration counts as reachable."""
        self._reach = ReachabilityChecks(self.check_reachable, workers) if probe is not None else None

    def close(self) -> None:
        if self._reach is not None:
            self._reach.close()

    def answers(self, address: str, key: bytes) -> bool:
        """Whether the process at `address` answers a fresh challenge under `key` (a network call: outside any
        lock); never without a probe."""
        return self._probe is not None and bool(answers_challenge(self._probe, address, key))

    def check_soon(self, replica: Replica) -> None:
        """A new registration: challenge it soon (without a probe, as in unit tests, it counts as reachable).
        Call with the lock held."""
        if self._reach is None:
            replica.reachable = True
        else:
            self._reach.submit(replica.replica_id, replica.push_key, FIRST_CHECK_S)

    def check_reachable(self, replica_id: str, key: bytes) -> float | None:
        """Challenge the registration `key` of `replica_id` at its address once. Returns None when settled
        (it answered: it may join pushes; or the registration is gone or replaced), else the seconds until
        the next check: after `QUICK_RETRIES_S`, it is held back (`controller.push_backoff_s`, doubling, as
        after failed pushes; its heartbeats tell it why) and checked again when that ends."""
        books = self._books
        with books.cond:
            replica = self._unproven(replica_id, key)
            if replica is None:
                return None
            address = replica.address
        answered = self.answers(address, key)
        with books.cond:
            replica = self._unproven(replica_id, key)
            if replica is None:
                return None
            if answered:
                replica.proven()
                books.events.write(ReplicaReachable(replica_id=replica_id, address=address,
                                                    failed_checks=replica.reach_failures))  # fmt: skip
                books.changed(replicas=True)
                return None
            replica.reach_failures += 1
            if replica.reach_failures <= len(QUICK_RETRIES_S):
                return QUICK_RETRIES_S[replica.reach_failures - 1]
            problem = (f"unreachable at {address}: nothing there answered the controller's challenge under this "
                       "registration's key (Rollout.GetStatus)")
            failures = replica.reach_failures - len(QUICK_RETRIES_S)
            seconds = replica.hold_back_unproven(books.clock(), books.config.push_backoff_s, failures - 1, problem)
            books.events.write(ReplicaHeldBack(replica_id=replica_id, address=address, seconds=seconds,
                                               failures=failures, problem=problem))  # fmt: skip
            books.changed(wake=False, replicas=True)
            return seconds

    def _unproven(self, replica_id: str, key: bytes) -> Replica | None:
        """The replica registered under `key` and not yet proven reachable (call with the lock held)."""
        if not self._books.registry.known(replica_id):
            return None
        replica = self._books.registry.get(replica_id)
        if replica.reachable or not hmac.compare_digest(replica.push_key, key):
            return None
        return replica
