"""When a checkpoint is written and what it unlocks: the buffer entries it covers are acknowledged once it is
complete on disk, never before (a learner that dies earlier trains them again from the checkpoint before).

In line, the learner stops for the whole save. In the background (`learner.checkpoint.background`), it stops
only to copy the state to host memory (`Checkpointer.stage`); a thread of its own writes the files, renames
the checkpoint into place and then acknowledges its entries. A one-rank learner whose loop fails while the
write is under way still finishes it, acknowledgement included (the interpreter waits for the thread); one
killed outright leaves only the temporary directory and the entries unacknowledged: both are consistent.
One save at a time: a save asked for while the previous one is still being written waits for it (that wait
is part of its stall). A write that failed raises in the loop at the next step, as it would have in line.

On a sharded learner every rank copies its shards when the leader stages a checkpoint and writes them on a
thread of its own (`FollowerSaves` on the other ranks); the leader's write returns once every rank's part is
on disk (torch.distributed.checkpoint's last step is collective), so its acknowledgement still comes after
the whole checkpoint.
"""

from __future__ import annotations

import time

from asyncrl.core.records.learner import CheckpointSaved
from asyncrl.core.runtime.one_at_a_time import OneAtATime
from asyncrl.learner.checkpoint import save_shards, stage_shards, write_shards
from asyncrl.learner.checkpoint_index import CheckpointMeta, Covered


class CheckpointSaver:
    def __init__(self, checkpointer, buffer, events, metrics, background: bool):
        self.checkpointer, self.buffer, self.events, self.metrics = checkpointer, buffer, events, metrics
        self._writes = OneAtATime("checkpoint") if background else None

    def save(self, model, optimizer, meta: CheckpointMeta, covered: list[str], groups: list[str] = ()) -> float:
        """Checkpoint `meta.step`, naming the entries it `covered` and their `groups` (the entries acknowledged
        once it is complete); returns the seconds this cost the caller: the whole save in line, the copy (and
        any wait for the previous save) in the background."""
        named = Covered(tuple(covered), tuple(groups))
        t0 = time.perf_counter()
        if self._writes is None:
            path = self.checkpointer.save(model, optimizer, meta, named)
            stall_s = time.perf_counter() - t0
            self._record(meta, path, covered, stall_s, stall_s, background=False)
            return stall_s
        self._writes.wait()
        staged = self.checkpointer.stage(model, optimizer, meta, named)
        stall_s = time.perf_counter() - t0
        self._writes.start(self._write, staged, covered, stall_s)
        return stall_s

    def in_line(self) -> None:
        """From now on save in line (the learner gave up the background copy to fit in memory)."""
        self.wait()
        self._writes = None

    def poll(self) -> None:
        """Raise the error of a background write that failed (once it is over; never waits)."""
        if self._writes is not None:
            self._writes.poll()

    def wait(self) -> None:
        """Wait for the background write in flight, if any (its failure is raised here)."""
        if self._writes is not None:
            self._writes.wait()

    def _write(self, staged, covered: list[str], stall_s: float) -> None:
        t0 = time.perf_counter()
        path = self.checkpointer.write(staged)
        self._record(staged.meta, path, covered, stall_s, stall_s + time.perf_counter() - t0, background=True)

    def _record(self, meta: CheckpointMeta, path, covered: list[str], stall_s: float, seconds: float,
                background: bool) -> None:
        self.buffer.ack(covered)
        self.metrics.checkpoint_stall_seconds.observe(stall_s)
        self.events.write(CheckpointSaved(step=meta.step, version=meta.version, path=str(path), acked=len(covered),
                                          seconds=seconds, stall_s=stall_s, background=background))


class FollowerSaves:
    """A follower rank's part of the leader's checkpoints (`sharding.follow`): its shards written in line
    (SAVE), or copied now and written on its checkpoint thread (STAGE), one write at a time."""

    def __init__(self, model, optimizer, ranks):
        self.model, self.optimizer, self.ranks = model, optimizer, ranks
        self._writes = OneAtATime("checkpoint")

    def save(self, path: str) -> None:
        self.wait()
        save_shards(path, self.model, self.optimizer)

    def stage(self, path: str) -> None:
        self.wait()
        self._writes.start(write_shards, path, stage_shards(self.model, self.optimizer), self.ranks)

    def wait(self) -> None:
        self._writes.wait()
