"""What reached the buffer under each lease, counted by Redis itself: the controller's check of a completion.

A replica completes a lease with the number of trajectories it wrote (`CompleteLease.num_written`), and the
controller counts that much of the lease's quota as admitted for good. Believed as it was, a token holder
completed leases as written without writing anything: 24 such calls used up the η quota and the learner waited
for data that never came. So every write of a group also adds its trajectories to a counter of its lease, in
the same Redis transaction as its XADD (`count_in`), and the controller takes at most what the counter holds
(`LeaseWriteCounts`), then drops it. Counters expire after `TTL_S` in any case (a lease that never completes).
"""

from __future__ import annotations

TTL_S = 24 * 3600


def key(stream: str, lease_id: str) -> str:
    return f"{stream}:written:{lease_id}"


def count_in(pipe, stream: str, group) -> None:
    """Queue, on the transaction `pipe` holding the group's XADD, the count of its trajectories under its lease
    (nothing for a group without a lease)."""
    if group.lease_id:
        pipe.incrby(key(stream, group.lease_id), len(group.trajectories))
        pipe.expire(key(stream, group.lease_id), TTL_S)


class LeaseWriteCounts:
    """The controller's reader of the counters (a Redis client, the buffer's stream)."""

    def __init__(self, client, stream: str):
        self._r, self._stream = client, stream

    def counts(self, lease_ids: list[str]) -> list[int]:
        """Trajectories written under each lease (0 for one nothing was written under)."""
        if not lease_ids:
            return []
        values = self._r.mget([key(self._stream, i) for i in lease_ids])
        return [int(v) if v is not None else 0 for v in values]

    def forget(self, lease_ids: list[str]) -> None:
        if lease_ids:
            self._r.delete(*[key(self._stream, i) for i in lease_ids])
