"""The buffer contract, run against every implementation (memory in unit tests, Redis in integration)."""

from __future__ import annotations

import threading
import time

from asyncrl.v1 import trajectory_pb2


def group(i: int) -> trajectory_pb2.TrajectoryGroup:
    t = trajectory_pb2.Trajectory(trajectory_id=f"g{i}/0", group_id=f"g{i}", prompt_token_ids=[1, 2],
                                  response_token_ids=[3], logp_behav=[-0.5], weight_version=[i], reward=1.0)
    return trajectory_pb2.TrajectoryGroup(group_id=f"g{i}", prompt_index=i, trajectories=[t])


def check_fifo_and_payload(buf):
    ids = [buf.put(group(i)) for i in range(3)]
    got = buf.get(10, timeout_s=1)
    assert [e.entry_id for e in got] == ids
    assert [e.group.group_id for e in got] == ["g0", "g1", "g2"]
    assert got[1].group.trajectories[0].logp_behav[0] == -0.5
    assert buf.backlog() == 0 and buf.pending() == 3


def check_put_many_writes_in_order(buf):
    single = buf.put(group(0))
    ids = buf.put_many([group(1), group(2), group(3)])
    assert all(isinstance(i, str) for i in ids) and len(set(ids)) == 3
    assert buf.put_many([]) == []
    got = buf.get(10, timeout_s=1)
    assert [e.entry_id for e in got] == [single, *ids]
    assert [e.group.group_id for e in got] == ["g0", "g1", "g2", "g3"]


def check_get_respects_max_and_timeout(buf):
    for i in range(5):
        buf.put(group(i))
    assert len(buf.get(2, timeout_s=1)) == 2
    assert len(buf.get(10, timeout_s=1)) == 3
    start = time.time()
    assert buf.get(1, timeout_s=0.3) == []
    assert time.time() - start >= 0.25


def check_get_with_zero_timeout_does_not_wait(buf):
    start = time.time()
    assert buf.get(5, timeout_s=0) == []
    assert time.time() - start < 0.2
    buf.put(group(0))
    buf.put(group(1))
    assert buf.get(0, timeout_s=0) == [] and buf.backlog() == 2  # room for none: nothing delivered
    assert [e.group.group_id for e in buf.get(5, timeout_s=0)] == ["g0", "g1"]


def check_blocking_get_wakes_on_put(buf):
    threading.Timer(0.2, lambda: buf.put(group(7))).start()
    got = buf.get(1, timeout_s=5)
    assert [e.group.group_id for e in got] == ["g7"]


def check_unacked_entries_are_redelivered_not_lost(buf_factory):
    """A consumer that crashed after reading (no ack) gets the same entries again on restart."""
    first = buf_factory()
    for i in range(4):
        first.put(group(i))
    delivered = first.get(3, timeout_s=1)
    first.ack([delivered[0].entry_id])
    restarted = buf_factory()
    again = restarted.all_pending()
    assert [e.group.group_id for e in again] == ["g1", "g2"]
    fresh = restarted.get(10, timeout_s=1)
    assert [e.group.group_id for e in fresh] == ["g3"]


def check_ack_once(buf):
    eid = buf.put(group(0))
    buf.get(1, timeout_s=1)
    assert buf.ack([eid]) == 1
    assert buf.ack([eid]) == 0
    assert buf.pending() == 0
    assert buf.get(1, timeout_s=0.2) == []
    assert eid not in buf.entry_ids()


def check_entry_ids_lists_unconsumed(buf):
    ids = [buf.put(group(i)) for i in range(3)]
    buf.get(1, timeout_s=1)
    assert sorted(buf.entry_ids()) == sorted(ids)


def check_bad_payloads_are_handed_out_and_dead_lettered(buf, put_raw):
    """`put_raw(bytes | None)` stores an entry with those payload bytes (None: no payload field at all)."""
    good = buf.put(group(0))
    noise = put_raw(b"\xff\x00garbage\x13")
    empty_fields = put_raw(None)
    got = {e.entry_id: e for e in buf.get(10, timeout_s=1)}
    assert got[good].problem is None and got[good].group.group_id == "g0"
    assert "not a TrajectoryGroup" in got[noise].problem
    assert "no payload" in got[empty_fields].problem
    buf.dead_letter(noise, got[noise].problem)
    buf.dead_letter(empty_fields, got[empty_fields].problem)
    buf.dead_letter(good, "trajectory 'g0/0': reward nan is not finite")
    # Gone from the stream (not pending, not listed), kept in the dead-letter stream with reason and bytes.
    assert buf.pending() == 0 and buf.entry_ids() == [] and buf.all_pending() == []
    dead = buf.dead_letters()
    assert [d.entry_id for d in dead] == [noise, empty_fields, good]
    assert dead[0].payload == b"\xff\x00garbage\x13" and dead[1].payload == b""
    assert trajectory_pb2.TrajectoryGroup.FromString(dead[2].payload).group_id == "g0"
    assert "reward nan" in dead[2].reason
    buf.put_dead_letter(group(1).SerializeToString(), "refused by its producer")
    assert buf.dead_letters()[-1].reason == "refused by its producer" and buf.dead_letters()[-1].entry_id == ""
