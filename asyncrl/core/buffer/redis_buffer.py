"""Redis Streams buffer: XADD by replicas, XREADGROUP + XACK by the learner's consumer group.

Every command reconnects and retries for up to `buffer.retry_s` when Redis is unreachable or silent past
`buffer.socket_timeout_s` (redis-py's Retry with exponential backoff), so a Redis restart or a cut link costs
a pause, not a crash. A read whose reply was lost on the way is made good: what Redis delivered to it is read
back from this consumer's pending entries. XADD is retried too: a write whose reply was lost can land twice;
the learner's exactly-once bookkeeping is per group id, and the audit shows such a duplicate as a group
trained twice.
"""

from __future__ import annotations

import redis

from asyncrl.core.buffer import lease_writes
from asyncrl.core.buffer.base import BufferEntry, DeadLetter, TrajectoryBuffer, decode_entry
from asyncrl.v1 import trajectory_pb2

PAYLOAD = b"g"
PAGE = 1000


def _fields(group: trajectory_pb2.TrajectoryGroup) -> dict:
    # The serialised group only. (A `min_version` field used to ride along; nothing read it, and computing it
    # over every token's version cost three times the serialisation.)
    return {PAYLOAD: group.SerializeToString()}


def _entry(entry_id: bytes, fields: dict) -> BufferEntry:
    return decode_entry(entry_id.decode(), fields.get(PAYLOAD))


class RedisBuffer(TrajectoryBuffer):
    def __init__(self, client: redis.Redis, stream: str, group: str, consumer: str, delete_after_ack: bool = True,
                 dead_letter_stream: str = "asyncrl:dead-letters", reads: bool = True):
        self._r = client  # `asyncrl.core.buffer.redis_connection.redis_client`: retries, password, TLS
        self.stream, self.group, self.consumer = stream, group, consumer
        self.delete_after_ack = delete_after_ack
        self.dead_stream = dead_letter_stream
        self._held: set[str] = set()
        """Entries this reader returned and has not acknowledged or dead-lettered."""
        if not reads:  # a writer (a replica) only appends; its Redis user may do nothing else
            return
        try:
            # "0": a group created after data arrived still sees everything already in the stream.
            self._r.xgroup_create(stream, group, id="0", mkstream=True)
        except redis.ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise

    def put(self, group: trajectory_pb2.TrajectoryGroup) -> str:
        reply = self.put_many([group])[0]
        if isinstance(reply, Exception):
            raise reply
        return reply

    def put_many(self, groups: list[trajectory_pb2.TrajectoryGroup]) -> list[str | Exception]:
        """One round trip, one transaction: each group's XADD with the count of its trajectories under its
        lease (`lease_writes`, what the controller checks a completion against). A failed XADD does not undo
        the others: each group's reply stands on its own."""
        if not groups:
            return []
        pipe = self._r.pipeline(transaction=True)
        positions = []
        for group in groups:
            positions.append(len(pipe.command_stack))
            pipe.xadd(self.stream, _fields(group))
            lease_writes.count_in(pipe, self.stream, group)
        replies = pipe.execute(raise_on_error=False)
        return [replies[i] if isinstance(replies[i], Exception) else replies[i].decode() for i in positions]

    def get(self, max_groups: int, timeout_s: float) -> list[BufferEntry]:
        if max_groups < 1:  # XREADGROUP refuses a COUNT below 1
            return []
        # ">" = never delivered (this consumer's delivered-but-unacked entries: `all_pending`). No BLOCK at
        # all for timeout_s 0 (BLOCK 0 would wait forever).
        block = max(1, int(timeout_s * 1000)) if timeout_s > 0 else None
        failures = self._failures()
        reply = self._r.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=max_groups, block=block)
        entries = []
        for _stream, items in reply or []:
            # An entry deleted after delivery comes back without fields: nothing to train on.
            entries.extend(_entry(entry_id, fields) for entry_id, fields in items if fields)
        if self._failures() != failures:
            entries += self._lost_on_the_way(entries)
        self._held.update(entry.entry_id for entry in entries)
        return entries

    def _failures(self) -> int:
        """Attempts of this client's calls that failed and were retried (`redis_connection._Retry`)."""
        return getattr(self._r.get_retry(), "failures", 0)

    def _lost_on_the_way(self, got: list[BufferEntry]) -> list[BufferEntry]:
        """After a read that was retried: Redis may have delivered entries to the attempt whose reply never
        came (a time-out, a cut). They are pending under this consumer, and no read of new entries returns
        them again: until a restart (`all_pending`) nobody would train them. Those not in hand yet."""
        known = self._held | {entry.entry_id for entry in got}
        return [entry for entry in self._own_pending() if entry.entry_id not in known]

    def ack(self, entry_ids: list[str]) -> int:
        if not entry_ids:
            return 0
        self._held.difference_update(entry_ids)
        pipe = self._r.pipeline()
        pipe.xack(self.stream, self.group, *entry_ids)
        if self.delete_after_ack:
            pipe.xdel(self.stream, *entry_ids)
        return int(pipe.execute()[0])

    def dead_letter(self, entry_id: str, reason: str) -> None:
        stored = self._r.xrange(self.stream, min=entry_id, max=entry_id)
        payload = stored[0][1].get(PAYLOAD, b"") if stored else b""
        # One transaction: the entry is either still pending here or in the dead-letter stream, never neither.
        pipe = self._r.pipeline(transaction=True)
        pipe.xadd(self.dead_stream, {b"entry_id": entry_id, b"reason": reason, PAYLOAD: payload})
        pipe.xack(self.stream, self.group, entry_id)
        pipe.xdel(self.stream, entry_id)
        pipe.execute()
        self._held.discard(entry_id)

    def put_dead_letter(self, payload: bytes, reason: str) -> str:
        return self._r.xadd(self.dead_stream, {b"entry_id": b"", b"reason": reason, PAYLOAD: payload}).decode()

    def dead_letters(self) -> list[DeadLetter]:
        out, start = [], "-"
        while True:
            chunk = self._r.xrange(self.dead_stream, min=start, max="+", count=PAGE)
            out.extend(DeadLetter(f[b"entry_id"].decode(), f[b"reason"].decode(errors="replace"), f.get(PAYLOAD, b""))
                       for _id, f in chunk)
            if len(chunk) < PAGE:
                return out
            start = "(" + chunk[-1][0].decode()

    def backlog(self) -> int:
        info = self._r.xinfo_groups(self.stream)
        for g in info:
            if g["name"].decode() == self.group:
                lag = g.get("lag")
                return int(lag) if lag is not None else 0
        return 0

    def pending(self) -> int:
        return int(self._r.xpending(self.stream, self.group)["pending"])

    def entry_ids(self) -> list[str]:
        return [entry_id.decode() for entry_id, _ in self._range()]

    def peek(self) -> list[BufferEntry]:
        return [_entry(entry_id, fields) for entry_id, fields in self._range() if fields]

    def all_pending(self) -> list[BufferEntry]:
        entries = self._own_pending()
        self._held = {entry.entry_id for entry in entries}
        return entries

    def _own_pending(self) -> list[BufferEntry]:
        """Every entry delivered to this consumer and not acknowledged yet."""
        entries, after = [], "0"
        while True:
            reply = self._r.xreadgroup(self.group, self.consumer, {self.stream: after}, count=PAGE)
            items = [item for _stream, chunk in reply or [] for item in chunk]
            entries.extend(_entry(entry_id, fields) for entry_id, fields in items if fields)
            if len(items) < PAGE:
                return entries
            after = items[-1][0].decode()

    def _range(self):
        start = "-"
        while True:
            chunk = self._r.xrange(self.stream, min=start, max="+", count=PAGE)
            yield from chunk
            if len(chunk) < PAGE:
                return
            start = "(" + chunk[-1][0].decode()

    def close(self) -> None:
        self._r.close()
