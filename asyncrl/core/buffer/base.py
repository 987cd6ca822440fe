"""The buffer seam.

Contract: `put` appends one TrajectoryGroup; `get` hands out up to `max_groups` entries not yet delivered to
this consumer (blocking up to `timeout_s`); entries stay *pending* until `ack`. A consumer that restarts
calls `all_pending()` and receives its own unacknowledged entries again, so a crash between read and ack
loses nothing. The learner acks once a checkpoint includes the step that used the data, so a learner that
restarts from that checkpoint trains the rest again: nothing lost, nothing counted twice.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from asyncrl.v1 import trajectory_pb2


@dataclass
class BufferEntry:
    entry_id: str
    group: trajectory_pb2.TrajectoryGroup


class TrajectoryBuffer(ABC):
    @abstractmethod
    def put(self, group: trajectory_pb2.TrajectoryGroup) -> str:
        """Append a group; returns its entry id."""

    @abstractmethod
    def get(self, max_groups: int, timeout_s: float) -> list[BufferEntry]:
        """Up to max_groups undelivered entries, oldest first; [] after timeout_s without data."""

    @abstractmethod
    def ack(self, entry_ids: list[str]) -> int:
        """Mark entries consumed; returns how many were pending."""

    @abstractmethod
    def backlog(self) -> int:
        """Entries written but not yet delivered to the consumer group."""

    @abstractmethod
    def pending(self) -> int:
        """Entries delivered but not yet acknowledged."""

    @abstractmethod
    def entry_ids(self) -> list[str]:
        """Ids of the entries still in the buffer (undelivered or unacknowledged)."""

    @abstractmethod
    def all_pending(self) -> list[BufferEntry]:
        """Every entry delivered to this consumer and not acknowledged, oldest first (a restarted learner
        takes these back before reading new data)."""

    @abstractmethod
    def peek(self) -> list[BufferEntry]:
        """Every entry still in the buffer, delivered or not, oldest first, without delivering any."""

    def close(self) -> None:
        """Release connections."""
