"""The join handshake in front of every push's broadcast group.

Forming a gloo/nccl group blocks every member until all `world_size` ranks arrive, for up to the push's
time-out. One receiver that died after the controller picked it (its process is gone, its heartbeat not yet
stale) would hold the learner and every healthy receiver for that long. So before the group forms:

- each receiver writes `ready/<rank>` into the push's store, then waits for the sender's verdict;
- the sender waits up to `join_timeout_s` for all ready keys, then writes the verdict: `go` (everybody
  forms the group) or `abort` (nobody does: receivers raise `PushAborted` at once, the sender raises
  `ReceiversMissing` naming the absent ranks, and the learner retries without them).

Keys live under the push's own prefix, so pushes never see each other's keys.
"""

from __future__ import annotations

import time

POLL_S = 0.005


class PushAborted(RuntimeError):
    """The sender called the push off before the group formed (some receiver never showed up)."""


class ReceiversMissing(RuntimeError):
    """Some receivers did not join within the join time-out; `ranks` lists them."""

    def __init__(self, push_id: str, ranks: list[int], join_timeout_s: float):
        super().__init__(f"push {push_id}: receivers of rank {ranks} did not join within {join_timeout_s:g} s")
        self.ranks = ranks


def sender_join(store, push_id: str, world_size: int, join_timeout_s: float) -> None:
    """Rank 0: wait for every receiver's ready key, then tell them all to go (or abort and raise)."""
    missing = set(range(1, world_size))
    deadline = time.monotonic() + join_timeout_s
    while missing:
        missing = {rank for rank in missing if not store.check([f"ready/{rank}"])}
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    if missing:
        store.set("verdict", f"abort: ranks {sorted(missing)} did not join")
        raise ReceiversMissing(push_id, sorted(missing), join_timeout_s)
    store.set("verdict", "go")


def receiver_join(store, push_id: str, rank: int, timeout_s: float) -> None:
    """Rank > 0: announce this rank, wait for the sender's verdict; raise PushAborted on abort."""
    store.set(f"ready/{rank}", "1")
    deadline = time.monotonic() + timeout_s
    while not store.check(["verdict"]):
        if time.monotonic() > deadline:
            raise PushAborted(f"push {push_id}: no verdict from the sender within {timeout_s:g} s")
        time.sleep(POLL_S)
    verdict = store.get("verdict").decode()
    if verdict != "go":
        raise PushAborted(f"push {push_id} called off by the sender ({verdict})")
