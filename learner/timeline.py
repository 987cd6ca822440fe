"""A learner continuing from a checkpoint that is behind the rest of the run: the timeline after the
checkpoint is lost (its policy versions never existed for the surviving model), and the run goes back to it.

- `drop_dead_timeline`: buffered groups generated with weights newer than the checkpoint go to the dead-letter
  stream with the reason (their version numbers are reissued by the new timeline, so staleness and the "not
  from the future" check would misread them); the rest survive. `asyncrl up --resume` and a learner that
  restarted alone both use it.
- `rejoin`: a learner restarted alone (the controller, the replicas and Redis kept running; `asyncrl up` after
  a learner crash, a Kubernetes restart) resets the controller's timeline to the checkpoint
  (`Controller.ResetTimeline`: version, N_r = step * B + surviving buffered trajectories, prompt cursor) and
  returns the `TimelineFilter` that keeps out groups of the lost timeline still arriving (leases it expired).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from asyncrl.core.records.controller import TimelineReset
from asyncrl.core.records.rollout import GroupRejected
from asyncrl.v1 import controller_pb2

log = logging.getLogger(__name__)


def drop_dead_timeline(buffer, entries: list, checkpoint_version: int, events) -> list:
    """Dead-letter `entries` generated with weights newer than `checkpoint_version` (and those already known
    bad); returns the survivors. Each rejection is recorded like the learner's own (`group_rejected`)."""
    survivors = []
    for entry in entries:
        versions = [v for t in entry.group.trajectories for v in t.weight_version]
        newest = max(versions, default=-1)
        if entry.problem is None and newest <= checkpoint_version:
            survivors.append(entry)
            continue
        reason = entry.problem or (f"generated with weight version {newest}, newer than the checkpoint's "
                                   f"{checkpoint_version}: the policy that made it did not survive the crash")
        buffer.dead_letter(entry.entry_id, reason)
        events.write(GroupRejected(entry_id=entry.entry_id, group_id=entry.group.group_id, reason=reason))
    return survivors


@dataclass(frozen=True)
class TimelineFilter:
    """Which entries belong to the new timeline: the survivors buffered at the reset, and groups of leases
    granted after it (prompt index at or past the reset's cursor). A lease of the lost timeline that was still
    generating at the reset writes a group with a prompt index below the cursor and no place in N_r."""

    cursor: int
    survivors: frozenset[str]

    def refusal(self, entry) -> str | None:
        if entry.entry_id in self.survivors or entry.group.prompt_index >= self.cursor:
            return None
        return (f"prompt_index: {entry.group.prompt_index} was leased on the timeline lost with the learner's "
                f"crash (the reset moved the cursor to {self.cursor})")


def rejoin(buffer, controller_stub, step: int, version: int, batch_size: int, events) -> TimelineFilter:
    """Reset the run to a checkpoint at (`step`, `version`) behind the controller; see the module doc."""
    survivors = drop_dead_timeline(buffer, buffer.peek(), version, events)
    admitted = step * batch_size + sum(len(e.group.trajectories) for e in survivors)
    cursor = max([e.group.prompt_index + 1 for e in survivors], default=0)
    reply = controller_stub.ResetTimeline(
        controller_pb2.ResetTimelineRequest(version=version, admitted=admitted, prompt_index=cursor), timeout=30)
    events.write(TimelineReset(version=version, admitted=admitted, prompt_index=reply.prompt_index,
                               survivors=len(survivors), leases_expired=reply.leases_expired))
    log.info("reset the run to version %d (N_r %d, %d groups survive, prompt cursor %d)", version, admitted,
             len(survivors), reply.prompt_index)
    return TimelineFilter(reply.prompt_index, frozenset(e.entry_id for e in survivors))
