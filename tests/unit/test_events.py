"""Event logs: writes are whole lines; a tail returns each complete record once, never a half-written one."""

import json

from asyncrl.core.events import EventLog, EventTail, read_events


def test_tail_returns_new_complete_records_once(tmp_path):
    log = EventLog(tmp_path, "learner")
    tail = EventTail(tmp_path, "learner")
    assert tail.poll() == []
    log.write("step", step=1)
    log.write("step", step=2)
    assert [e["step"] for e in tail.poll()] == [1, 2]
    assert tail.poll() == []
    # A record caught half-written is not returned until its newline arrives.
    with log.path.open("a") as f:
        f.write(json.dumps({"t": 0, "kind": "step", "step": 3})[:10])
    assert tail.poll() == []
    with log.path.open("a") as f:
        f.write(json.dumps({"t": 0, "kind": "step", "step": 3})[10:] + "\n")
    assert [e["step"] for e in tail.poll()] == [3]
    assert [e["step"] for e in read_events(tmp_path, "learner")] == [1, 2, 3]
    log.close()
