"""The buffer seam.

Contract: `put` appends one TrajectoryGroup; `get` hands out up to `max_groups` entries not yet delivered to
this consumer (blocking up to `timeout_s`); entries stay *pending* until `ack`. A consumer that restarts
calls `all_pending()` and receives its own unacknowledged entries again, so a crash between read and ack
loses nothing. The learner acks once a checkpoint includes the step that used the data, so a learner that
restarts from that checkpoint trains the rest again: nothing lost, nothing counted twice.

An entry whose payload is not a TrajectoryGroup is handed out like any other, with `problem` set, so the
reader can `dead_letter` it (moved to the dead-letter stream with its reason, acked here): a bad entry never
crashes the reader and never blocks the stream.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from asyncrl.v1 import trajectory_pb2


@dataclass
class BufferEntry:
    entry_id: str
    group: trajectory_pb2.TrajectoryGroup
    problem: str | None = None
    """Why the entry cannot be read (then `group` is empty)."""


@dataclass
class DeadLetter:
    entry_id: str
    reason: str
    payload: bytes = field(repr=False, default=b"")


def decode_entry(entry_id: str, payload: bytes | None) -> BufferEntry:
    """A BufferEntry from stored bytes; an unreadable payload gives an entry with `problem` set."""
    if payload is None:
        return BufferEntry(entry_id, trajectory_pb2.TrajectoryGroup(), "payload: the entry has no payload field")
    try:
        return BufferEntry(entry_id, trajectory_pb2.TrajectoryGroup.FromString(payload))
    except (DecodeError, ValueError) as err:
        return BufferEntry(entry_id, trajectory_pb2.TrajectoryGroup(),
                           f"payload: {len(payload)} bytes are not a TrajectoryGroup ({err})")


class TrajectoryBuffer(ABC):
    @abstractmethod
    def put(self, group: trajectory_pb2.TrajectoryGroup) -> str:
        """Append a group; returns its entry id."""

    def put_many(self, groups: list[trajectory_pb2.TrajectoryGroup]) -> list[str | Exception]:
        """Append several groups, in one round trip where the store allows; for each, its entry id or the
        error that kept it out (the others are written regardless)."""
        out: list[str | Exception] = []
        for group in groups:
            try:
                out.append(self.put(group))
            except Exception as err:  # noqa: BLE001 - reported per group, as the contract says
                out.append(err)
        return out

    @abstractmethod
    def get(self, max_groups: int, timeout_s: float) -> list[BufferEntry]:
        """Up to max_groups undelivered entries, oldest first; [] after timeout_s without data (0: what is
        there now, without waiting)."""

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
    def dead_letter(self, entry_id: str, reason: str) -> None:
        """Move a delivered entry to the dead-letter stream with `reason` (and its original bytes), acking it
        here, in one step."""

    @abstractmethod
    def put_dead_letter(self, payload: bytes, reason: str) -> str:
        """Write straight to the dead-letter stream (a producer refusing its own bad data); returns its id."""

    @abstractmethod
    def dead_letters(self) -> list[DeadLetter]:
        """Everything in the dead-letter stream, oldest first."""

    @abstractmethod
    def peek(self) -> list[BufferEntry]:
        """Every entry still in the buffer, delivered or not, oldest first, without delivering any."""

    def close(self) -> None:
        """Release connections."""
