"""Admission: the part of `ControllerState` that grants leases under the staleness bound, counts the requests
held for one, and takes leases back. It works on the state's books (`controller.books`).

A request the η rule (or a replica's missing weights) forbids is held without a thread: a coroutine
(`controller.held_request.hold`) calls `try_acquire` again whenever a waker registered with `add_waker` fires.
Every change that can make a held request admissible wakes the wakers (`StateBooks.changed`).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

from asyncrl.controller import staleness
from asyncrl.controller.books import StateBooks
from asyncrl.controller.errors import InvalidRequest, PreconditionFailed
from asyncrl.controller.liveness import Liveness
from asyncrl.controller.registry import UNPROVEN, Replica
from asyncrl.controller.results import LeaseBatch, LeaseDecision
from asyncrl.core.buffer.lease_writes import LeaseWriteCounts
from asyncrl.core.records.controller import LeaseCompleted, LeaseGranted, QuotaReturned

log = logging.getLogger(__name__)

RETURNS_REMEMBERED = 100_000


class Admission:
    def __init__(self, books: StateBooks, liveness: Liveness, lease_writes: LeaseWriteCounts | None):
        self._books = books
        self._liveness = liveness
        self._lease_writes = lease_writes
        """What reached the buffer under each lease: a completion counts at most that (`complete`); None: the
        completion's claim stands (unit tests, an in-memory buffer, simulated replicas)."""
        self._returned: OrderedDict[str, None] = OrderedDict()
        """Entries whose quota the learner returned (the last RETURNS_REMEMBERED): a retried call returns none."""

    def try_acquire(self, replica_id: str, num_trajectories: int, started: float, final: bool,
                    first: bool = True) -> LeaseDecision | None:
        """One look at a lease request, never waiting: a grant; a refusal with its reason when `final`; else None
        (the caller holds the request and asks again when woken). `started`: when the request arrived
        (time.monotonic), for the hold time; `first`: the request's first look."""
        return _one(self.try_acquire_many(replica_id, num_trajectories, 1, started, final, first))

    def try_acquire_many(self, replica_id: str, num_trajectories: int, max_leases: int, started: float,
                         final: bool, first: bool = True) -> LeaseBatch | None:
        """`try_acquire` for up to `max_leases` leases: the first decided as `try_acquire` decides it, more only
        while each is admissible at once (the η rule is checked lease by lease). A refusal (no lease, its
        reason) only when `final`; else None while the first must wait."""
        with self._books.cond:
            replica = self._books.registry.get(replica_id)
            self._liveness.reap_locked()
            if first:
                # Its arrival is a sign of life; looking at it again later is not (the replica may have hung
                # since: it heartbeats on a thread of its own meanwhile, or not at all).
                self._liveness.touch(replica)
            return self._decide_many(replica, num_trajectories, max_leases, started, final)

    def hold_limit(self, wait_s: float) -> float:
        """How long a request asking to wait `wait_s` is held at most."""
        return min(max(wait_s, 0.0), self._books.config.max_hold_s)

    def holding(self, delta: int) -> None:
        """Count a request the caller starts (+1) or stops (-1) holding."""
        books = self._books
        with books.cond:
            books.held += delta
            books.metrics.held_requests.set(books.held)

    def answered(self, started: float) -> None:
        """A lease request that arrived at `started` (time.monotonic) got its answer, held or not."""
        self._books.metrics.lease_hold_seconds.observe(time.monotonic() - started)

    def add_waker(self, wake) -> None:
        """Call `wake()` (from any thread, under the lock: it must only schedule) whenever a held request may
        have become admissible."""
        with self._books.cond:
            self._books.wakers.append(wake)

    def remove_waker(self, wake) -> None:
        with self._books.cond:
            self._books.wakers.remove(wake)

    def return_quota(self, entry_id: str, trajectories: int, reason: str, prompt: int | None = None,
                     lease_id: str = "") -> tuple[int, int]:
        """The learner will not train the group of buffer entry `entry_id` (it is older than η at the version that
        would train it): its `trajectories` leave N_r, so fresh ones are admitted in their place, and `prompt`
        (the stream prompt it was generated for; None: none) is generated again by the next lease granted; the
        held requests are woken. A group whose lease (`lease_id`) expired returns nothing: its quota came back
        at the expiry. Once per entry (a retried call does nothing). Returns (returned, N_r after)."""
        books = self._books
        with books.cond:
            if entry_id in self._returned:
                return 0, books.leases.admitted
            self._returned[entry_id] = None
            while len(self._returned) > RETURNS_REMEMBERED:
                self._returned.popitem(last=False)
            expired = (books.leases.fate(lease_id) or "").startswith("expired")
            returned = 0 if expired else min(trajectories, books.leases.admitted)
            books.leases.admitted -= returned
            if prompt is not None:
                books.leases.regenerate.append(prompt)
            books.events.write(QuotaReturned(entry_id=entry_id, returned=returned,
                                             admitted_after=books.leases.admitted, reason=reason,
                                             prompt_index=prompt, lease_id=lease_id))
            books.changed(wake=returned > 0)
            return returned, books.leases.admitted

    def outstanding(self, version: int) -> tuple[int, int]:
        """(leases granted at `version` or below still active, the oldest version among them; -1 when none),
        after expiring those past their time."""
        with self._books.cond:
            self._liveness.reap_locked()
            return self._books.leases.outstanding(version)

    def add_end_waker(self, wake) -> None:
        """Call `wake()` (from any thread, under the lock: it must only schedule) whenever a lease ended."""
        with self._books.cond:
            self._books.end_wakers.append(wake)

    def complete(self, replica_id: str, lease_id: str, num_written: int) -> int:
        """Close a lease; the unwritten part of its quota returns. Returns the quota returned."""
        books = self._books
        counted = self._written([lease_id])  # a Redis read: outside the lock
        with books.cond:
            replica = books.registry.get(replica_id)
            self._liveness.reap_locked()  # first: a lease past its expiry is expired, whatever the reaper's timing
            self._liveness.touch(replica)
            returned = self._complete_locked(replica_id, lease_id, num_written, counted.get(lease_id))
            books.changed(wake=returned > 0)
        self._forget_written([lease_id])
        return returned

    def _written(self, lease_ids: list[str]) -> dict[str, int]:
        """Trajectories that reached the buffer under each lease (`asyncrl.core.buffer.lease_writes`); empty when
        not known (no Redis buffer, Redis unreachable): then the completion's claim stands."""
        if self._lease_writes is None:
            return {}
        try:
            return dict(zip(lease_ids, self._lease_writes.counts(lease_ids)))
        except Exception as err:  # noqa: BLE001 - a completion must not fail for a check it cannot make
            log.warning("could not read what reached the buffer under %d lease(s): %s", len(lease_ids), err)
            return {}

    def _forget_written(self, lease_ids: list[str]) -> None:
        if self._lease_writes is None:
            return
        try:
            self._lease_writes.forget(lease_ids)
        except Exception as err:  # noqa: BLE001 - the counters expire by themselves
            log.warning("could not drop the write counters of %d lease(s): %s", len(lease_ids), err)

    def complete_many(self, replica_id: str, completions: list[tuple[str, int, float | None]]) -> list[str]:
        """Close several leases (lease id, num_written, the mean reward of its samples or None), each on its
        own: per lease "" when it completed, or why not (expired, unknown). A malformed completion (another
        replica's lease, more written than leased) raises InvalidRequest naming `completions[i].<field>` before
        any is applied. One write."""
        books = self._books
        counted = self._written([lease_id for lease_id, *_ in completions])  # outside the lock
        with books.cond:
            replica = books.registry.get(replica_id)
            self._liveness.reap_locked()
            self._liveness.touch(replica)
            for i, (lease_id, num_written, _) in enumerate(completions):
                books.leases.check_completion(replica_id, lease_id, num_written, prefix=f"completions[{i}].")
            outcomes, returned = [], 0
            for i, (lease_id, num_written, reward_mean) in enumerate(completions):
                try:
                    returned += self._complete_locked(replica_id, lease_id, num_written, counted.get(lease_id),
                                                      reward_mean)
                    outcomes.append("")
                except PreconditionFailed as err:
                    outcomes.append(f"completions[{i}].{err}")
            books.changed(wake=returned > 0)
        self._forget_written([c[0] for c, outcome in zip(completions, outcomes) if not outcome])
        return outcomes

    # ---- internals (call with the lock held) ------------------------------------------------------------

    def _complete_locked(self, replica_id: str, lease_id: str, num_written: int, counted: int | None,
                         reward_mean: float | None = None) -> int:
        """`counted`: what reached the buffer under the lease (None: not known); the lease counts at most that.
        `reward_mean`: its samples' mean reward, for the difficulty estimate of the prompt they were for."""
        books = self._books
        claimed = num_written
        if counted is not None:
            num_written = min(num_written, counted)
        lease, returned = books.leases.complete(replica_id, lease_id, num_written)
        if reward_mean is not None:
            books.difficulty.observe(lease.sampled_prompt, lease.num_trajectories, reward_mean)
        books.events.write(LeaseCompleted(
            lease_id=lease_id, replica_id=replica_id, n=lease.num_trajectories, num_written=num_written,
            returned=returned, admitted_after=books.leases.admitted, reward_mean=reward_mean,
            claimed=claimed if claimed != num_written else None,
        ))  # fmt: skip
        return returned

    def _decide_many(self, replica: Replica, n: int, max_leases: int, started: float,
                     final: bool) -> LeaseBatch | None:
        books = self._books
        if n > books.batch_size:
            # Larger than B could starve forever under η = 0; one lease is one group and G divides B.
            raise InvalidRequest("num_trajectories", f"must be <= batch_size ({books.batch_size}), got {n}")
        reason = self._refusal(replica, n)
        held_s = time.monotonic() - started
        if reason is not None:
            return LeaseBatch([], reason, books.current_version, held_s) if final else None
        now = books.clock()
        granted = []  # (lease, N_r right after it: what the η rule admitted it against, a prompt generated again)
        while reason is None:
            regenerated = bool(books.leases.regenerate)
            hard = None if regenerated else books.difficulty.choose(room=self._room_in_step())
            size = n if hard is None else books.difficulty.group_size(n)
            lease = books.leases.grant(replica.replica_id, size, books.current_version, now)
            if hard is not None:
                lease.sample_index = hard
            granted.append((lease, books.leases.admitted, regenerated))
            if len(granted) == max_leases:
                break  # all asked for: no reason to give, and no rule to check for a lease nobody wants
            reason = self._refusal(replica, n)
        # One write for all of them, before the answer and the events: a restart knows every lease it granted.
        books.persist()
        decisions = [self._announce(replica, lease, admitted, now, held_s, regenerated)
                     for lease, admitted, regenerated in granted]
        return LeaseBatch(decisions, reason or "", books.current_version, held_s)

    def _room_in_step(self) -> int:
        """Trajectories still admissible into the share of the learner step that N_r is filling. A larger group
        fits only there: it never straddles two steps, so admitted in order, whole groups fill each batch, and
        admissible for its first trajectory it is for its last (the η rule, checked for a lease of `n`)."""
        books = self._books
        return books.batch_size - books.leases.admitted % books.batch_size

    def _refusal(self, replica: Replica, n: int) -> str | None:
        """Why a lease of n for this replica cannot be granted now (None = it can)."""
        books = self._books
        current = books.current_version
        if not replica.alive:
            return f"replica {replica.replica_id!r} was declared dead; register again"
        if replica.needs_sync(current):
            why = ("its last push failed" if replica.force_sync
                   else "no push has reached it yet" if replica.weight_version == UNPROVEN
                   else f"it holds version {replica.weight_version}")
            return f"replica needs a weight sync to version {current} ({why})"
        if not staleness.admissible(books.leases.admitted, n, books.batch_size, current, books.eta):
            limit = staleness.max_admissible(current, books.batch_size, books.eta)
            return (
                f"staleness bound: N_r would reach {books.leases.admitted + n} > (i+eta+1)*B = {limit} "
                f"(i={current}, eta={books.eta}, B={books.batch_size}); waiting for version {current + 1}"
            )
        return None

    def _announce(self, replica: Replica, lease, admitted_after: int, now: float, held_s: float,
                  regenerated: bool) -> LeaseDecision:
        """The event, metrics and answer of a lease granted (and persisted) at `now`, which brought N_r to
        `admitted_after`; `regenerated`: its sample_index is a dropped group's prompt generated again."""
        books = self._books
        n = lease.num_trajectories
        books.events.write(LeaseGranted(
            lease_id=lease.lease_id, replica_id=replica.replica_id, n=n, admitted_after=admitted_after,
            version=lease.version, eta=books.eta, batch_size=books.batch_size, prompt_index=lease.prompt_index,
            held_s=held_s, sample_index=lease.sample_index, regenerated=regenerated,
        ))  # fmt: skip
        books.metrics.leases_granted.inc()
        books.metrics.prompts_regenerated.inc(int(regenerated))
        books.metrics.hard_prompt_replays.inc(int(lease.sample_index is not None and not regenerated))
        books.publish_gauges()
        expires_unix_s = books.wall() + (lease.expires_at - now)
        return LeaseDecision(True, lease.version, lease.lease_id, lease.prompt_index, expires_unix_s, "", held_s,
                             lease.sample_index, n)


def _one(batch: LeaseBatch | None) -> LeaseDecision | None:
    """The answer to a one-lease request from its batch of at most one: the grant, or the refusal."""
    if batch is None:
        return None
    if batch.leases:
        return batch.leases[0]
    return LeaseDecision(False, batch.version, reason=batch.reason, held_s=batch.held_s)
