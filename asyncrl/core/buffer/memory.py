"""In-process buffer with the same delivery/ack semantics as the Redis one (unit tests only)."""

from __future__ import annotations

import threading
from collections import OrderedDict

from asyncrl.core.buffer.base import BufferEntry, DeadLetter, TrajectoryBuffer, decode_entry
from asyncrl.v1 import trajectory_pb2


class MemoryBuffer(TrajectoryBuffer):
    def __init__(self):
        self._cond = threading.Condition()
        self._undelivered: OrderedDict[str, bytes | None] = OrderedDict()
        self._pending: OrderedDict[str, bytes | None] = OrderedDict()
        self._next = 0
        self._dead: list[DeadLetter] = []

    def put(self, group: trajectory_pb2.TrajectoryGroup) -> str:
        with self._cond:
            self._next += 1
            entry_id = f"{self._next}-0"
            self._undelivered[entry_id] = group.SerializeToString()
            self._cond.notify_all()
            return entry_id

    def get(self, max_groups: int, timeout_s: float) -> list[BufferEntry]:
        with self._cond:
            self._cond.wait_for(lambda: self._undelivered, timeout=timeout_s)
            items = []
            while self._undelivered and len(items) < max_groups:
                entry_id, payload = self._undelivered.popitem(last=False)
                self._pending[entry_id] = payload
                items.append((entry_id, payload))
        return [decode_entry(eid, p) for eid, p in items]

    def put_raw(self, payload: bytes | None) -> str:
        """Append arbitrary bytes (None: an entry without payload) as an entry, for tests of bad payloads."""
        with self._cond:
            self._next += 1
            entry_id = f"{self._next}-0"
            self._undelivered[entry_id] = payload
            self._cond.notify_all()
            return entry_id

    def dead_letter(self, entry_id: str, reason: str) -> None:
        with self._cond:
            payload = self._pending.pop(entry_id, None) or self._undelivered.pop(entry_id, b"")
            self._dead.append(DeadLetter(entry_id, reason, payload))

    def put_dead_letter(self, payload: bytes, reason: str) -> str:
        with self._cond:
            self._dead.append(DeadLetter("", reason, payload))
            return f"dead-{len(self._dead)}"

    def dead_letters(self) -> list[DeadLetter]:
        with self._cond:
            return list(self._dead)

    def ack(self, entry_ids: list[str]) -> int:
        with self._cond:
            return sum(self._pending.pop(e, None) is not None for e in entry_ids)

    def backlog(self) -> int:
        with self._cond:
            return len(self._undelivered)

    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def entry_ids(self) -> list[str]:
        with self._cond:
            return [*self._pending, *self._undelivered]

    def all_pending(self) -> list[BufferEntry]:
        with self._cond:
            items = list(self._pending.items())
        return [decode_entry(eid, p) for eid, p in items]

    def peek(self) -> list[BufferEntry]:
        with self._cond:
            items = [*self._pending.items(), *self._undelivered.items()]
        return [decode_entry(eid, p) for eid, p in items]
