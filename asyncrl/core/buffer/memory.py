"""In-process buffer with the same delivery/ack semantics as the Redis one (unit tests only)."""

from __future__ import annotations

import threading
from collections import OrderedDict

from asyncrl.core.buffer.base import BufferEntry, TrajectoryBuffer
from asyncrl.v1 import trajectory_pb2


class MemoryBuffer(TrajectoryBuffer):
    def __init__(self):
        self._cond = threading.Condition()
        self._undelivered: OrderedDict[str, bytes] = OrderedDict()
        self._pending: OrderedDict[str, bytes] = OrderedDict()
        self._next = 0

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
        return [BufferEntry(eid, trajectory_pb2.TrajectoryGroup.FromString(p)) for eid, p in items]

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
        return [BufferEntry(eid, trajectory_pb2.TrajectoryGroup.FromString(p)) for eid, p in items]

    def peek(self) -> list[BufferEntry]:
        with self._cond:
            items = [*self._pending.items(), *self._undelivered.items()]
        return [BufferEntry(eid, trajectory_pb2.TrajectoryGroup.FromString(p)) for eid, p in items]
