"""Lease book: the admitted-trajectory count N_r, the active leases and the training-stream cursor.

Not thread-safe by itself: `ControllerState` owns one and guards it with its lock.

Quota accounting: granting a lease of n trajectories adds n to `admitted`; completing it with `num_written`
returns `n - num_written` (what was never written must not count against the staleness bound); an expired
lease returns all n. Prompt indices are handed out in stream order, one per lease, and are not reissued when
a lease returns its quota: a lost group simply skips that prompt, which keeps the stream cursor monotone and
makes a late write of an expired lease harmless for ordering. A group the learner dropped for its age is
different: its prompt joins `regenerate`, and the next leases sample it again (as their `sample_index`).
"""

from __future__ import annotations

import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass

from asyncrl.controller.errors import InvalidRequest, PreconditionFailed

# How many ended lease ids are remembered, so a late CompleteLease can be told "expired" rather than
# "unknown". Bounded: old ids fall out and then read as unknown, which is answered the same way.
_ENDED_MEMORY = 4096


@dataclass
class Lease:
    lease_id: str
    replica_id: str
    num_trajectories: int
    prompt_index: int
    version: int
    """Policy version at admission."""
    granted_at: float
    expires_at: float
    """When the reaper expires it, unless completed: moved on by heartbeats, never past `ends_by`."""
    ends_by: float = float("inf")
    """`granted_at + controller.lease_max_s`: heartbeats do not keep the lease alive past this."""
    sample_index: int | None = None
    """The prompt this lease samples instead of its own `prompt_index`: a dropped group's prompt generated again
    (`LeaseBook.regenerate`) or a hard prompt sampled again (`controller.difficulty`)."""

    @property
    def sampled_prompt(self) -> int:
        """The stream prompt the lease's samples are generated for."""
        return self.prompt_index if self.sample_index is None else self.sample_index

    @property
    def at_max_age(self) -> bool:
        """Its expiry is the age limit, not a missed renewal."""
        return self.expires_at >= self.ends_by


class LeaseBook:
    def __init__(self, lease_ttl_s: float, admitted: int = 0, next_prompt_index: int = 0, lease_max_s: float = 0.0):
        self.lease_ttl_s = lease_ttl_s
        self.lease_max_s = lease_max_s
        """`controller.lease_max_s` (0: no limit)."""
        self.admitted = admitted
        """N_r: trajectories admitted so far, net of returned quota (a resumed run starts past its history)."""
        self.next_prompt_index = next_prompt_index
        self.granted_total = 0
        self.expired_total = 0
        self.ended_total = 0
        """Leases ended, completed or expired (what the learner's `AwaitLeases` waits on moves with it)."""
        self.regenerate: deque[int] = deque()
        """Prompts of groups the learner dropped for their age, to be generated again: each of the next leases
        samples the first of them (its `sample_index`) before the stream, or a hard prompt, gets a turn."""
        self._active: dict[str, Lease] = {}
        self._ended: OrderedDict[str, str] = OrderedDict()  # lease_id -> "completed" | "expired: <why>"

    def fresh_clock(self, now: float) -> tuple[float, float]:
        """(expires_at, ends_by) of a lease granted, or restored after a controller restart, at `now`: one TTL,
        never past `now + lease_max_s`."""
        ends_by = now + self.lease_max_s if self.lease_max_s > 0 else float("inf")
        return min(now + self.lease_ttl_s, ends_by), ends_by

    def grant(self, replica_id: str, num_trajectories: int, version: int, now: float) -> Lease:
        expires_at, ends_by = self.fresh_clock(now)
        lease = Lease(
            lease_id=f"lease-{uuid.uuid4().hex[:12]}",
            replica_id=replica_id,
            num_trajectories=num_trajectories,
            prompt_index=self.next_prompt_index,
            version=version,
            granted_at=now,
            expires_at=expires_at,
            ends_by=ends_by,
            sample_index=self.regenerate.popleft() if self.regenerate else None,
        )
        self._active[lease.lease_id] = lease
        self.admitted += num_trajectories
        self.next_prompt_index += 1
        self.granted_total += 1
        return lease

    def check_completion(self, replica_id: str, lease_id: str, num_written: int, prefix: str = "") -> None:
        """Raise InvalidRequest (field names after `prefix`) when completing an active lease like this would be
        a malformed request: another replica's lease, more written than leased. A lease no longer active is
        not checked here (`complete` says it is expired or unknown)."""
        lease = self._active.get(lease_id)
        if lease is None:
            return
        if lease.replica_id != replica_id:
            raise InvalidRequest(f"{prefix}lease_id", f"lease {lease_id!r} belongs to replica {lease.replica_id!r}")
        if num_written > lease.num_trajectories:
            raise InvalidRequest(
                f"{prefix}num_written",
                f"must be <= the lease's {lease.num_trajectories} trajectories, got {num_written}",
            )

    def complete(self, replica_id: str, lease_id: str, num_written: int) -> tuple[Lease, int]:
        """Close an active lease; returns it and the quota returned (n - num_written)."""
        lease = self._active.get(lease_id)
        if lease is None:
            fate = self._ended.get(lease_id)
            raise PreconditionFailed(
                f"lease_id: lease {lease_id!r} is {fate}" if fate else f"lease_id: unknown lease {lease_id!r}"
            )
        self.check_completion(replica_id, lease_id, num_written)
        returned = lease.num_trajectories - num_written
        self._end(lease, "completed", returned)
        return lease, returned

    def extend(self, replica_id: str, now: float, held: set[str] | None = None, grace_s: float = 0.0) -> list[Lease]:
        """A heartbeat keeps the replica's leases alive for another TTL (never past their `ends_by`): all of
        them, or (`held` reported) only those it still holds. A lease it no longer lists, granted more than
        `grace_s` ago, was abandoned (a completion that never got through, a batch that failed): it expires now
        and returns its quota, so heartbeats cannot keep it alive. Returns the abandoned leases."""
        abandoned = []
        for lease in self.of_replica(replica_id):
            if held is None or lease.lease_id in held:
                lease.expires_at = min(max(lease.expires_at, now + self.lease_ttl_s), lease.ends_by)
            elif now - lease.granted_at > grace_s:
                abandoned.append(lease)
        for lease in abandoned:
            self._end(lease, "expired: abandoned", lease.num_trajectories)
        return abandoned

    def postpone_all(self, seconds: float) -> None:
        """Move every active lease's expiry and age limit `seconds` later (time the controller itself stood
        still)."""
        for lease in self._active.values():
            lease.expires_at += seconds
            lease.ends_by += seconds

    def expire_due(self, now: float) -> list[tuple[Lease, str]]:
        """Expire every lease past its expiry time; returns each with why ("max_age": it reached
        `lease_max_s`, heartbeats or not; "ttl": nothing renewed it). Each returned its whole quota."""
        due = [(lease, "max_age" if lease.at_max_age else "ttl") for lease in self._active.values()
               if lease.expires_at <= now]
        for lease, why in due:
            self._end(lease, f"expired: {why}", lease.num_trajectories)
        return due

    def expire_replica(self, replica_id: str, why: str) -> list[Lease]:
        """Expire every active lease of one replica (it died or restarted)."""
        leases = self.of_replica(replica_id)
        for lease in leases:
            self._end(lease, f"expired: {why}", lease.num_trajectories)
        return leases

    def expire_all(self, why: str) -> list[Lease]:
        """Expire every active lease (a timeline reset); returns them."""
        leases = list(self._active.values())
        for lease in leases:
            self._end(lease, f"expired: {why}", lease.num_trajectories)
        return leases

    def restart_counts(self, admitted: int, next_prompt_index: int) -> int:
        """A new timeline's N_r; the prompt cursor never moves back (lost prompts are skipped). Returns it."""
        self.admitted = admitted
        self.next_prompt_index = max(self.next_prompt_index, next_prompt_index)
        return self.next_prompt_index

    def restore(self, admitted: int, next_prompt_index: int, granted_total: int, expired_total: int,
                leases: list[Lease], regenerate: list[int] = ()) -> None:
        """Continue a saved book (a controller restart): its counters, its active leases and the prompts still
        to generate again."""
        self.admitted, self.next_prompt_index = admitted, next_prompt_index
        self.granted_total, self.expired_total = granted_total, expired_total
        self._active = {lease.lease_id: lease for lease in leases}
        self.regenerate = deque(regenerate)

    def fate(self, lease_id: str) -> str | None:
        """"active", "completed", "expired: <why>", or None when not known (never granted, or long forgotten)."""
        if lease_id in self._active:
            return "active"
        return self._ended.get(lease_id)

    def outstanding(self, version: int) -> tuple[int, int]:
        """(active leases granted at `version` or below, the oldest version among them; -1 when none)."""
        versions = [lease.version for lease in self._active.values() if lease.version <= version]
        return len(versions), min(versions, default=-1)

    def active_by_id(self) -> dict[str, Lease]:
        return self._active

    def of_replica(self, replica_id: str) -> list[Lease]:
        return [lease for lease in self._active.values() if lease.replica_id == replica_id]

    def active(self) -> list[Lease]:
        return list(self._active.values())

    def _end(self, lease: Lease, fate: str, returned: int) -> None:
        del self._active[lease.lease_id]
        self.ended_total += 1
        self.admitted -= returned
        if fate.startswith("expired"):
            self.expired_total += 1
        self._ended[lease.lease_id] = fate
        while len(self._ended) > _ENDED_MEMORY:
            self._ended.popitem(last=False)
