"""What `asyncrl up` records at the end of a run when the learner could not.

A learner that ends normally (its last step, or SIGTERM) writes `final_buffer`: the entries still in the
buffer, which the audit needs to tell unconsumed data from lost data. A learner killed shortly before the end
(or stopped while `up` was starting it again) writes nothing more: its steps after its last checkpoint died
with it, and the groups they consumed are still pending in the buffer, to be trained again by the next
learner. Without a record of that, the audit counted those groups as trained and everything else still in the
buffer as lost.

So `up`, after stopping the learner and before stopping Redis, closes the learner's log for it: a
`learner_lost` record naming the checkpoint the run continues from (the audit voids the steps after it, as it
does after `resumed`), then `final_buffer` with the buffer's entries.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from asyncrl.core.buffer import make_buffer
from asyncrl.core.records.learner import FinalBuffer, LearnerLost
from asyncrl.core.runtime.events import EventLog
from asyncrl.learner.checkpoint_index import latest_checkpoint, read_meta

log = logging.getLogger(__name__)


def learner_closed_its_log(run_dir) -> bool:
    """Whether the learner's last process wrote its `final_buffer` (after its last `resumed`, the record each
    learner process starts with); True for a log with nothing in it. A search of the bytes, not a parse: the
    audit right after parses the whole log, which grows by megabytes a minute. (`EventLog` writes compact JSON,
    and a quote inside a value is escaped, so `"kind":"..."` only ever matches a record's kind.)"""
    path = Path(run_dir) / "events" / "learner.jsonl"
    data = path.read_bytes() if path.exists() else b""
    if not data.strip():
        return True
    last_start = data.rfind(b'"kind":"resumed"')
    return data.find(b'"kind":"final_buffer"', max(last_start, 0)) >= 0


def close_learner_log(cfg) -> str | None:
    """Write `learner_lost` and `final_buffer` into the learner's log when its last process did not end it;
    returns what was done (a line for the console), or None when the learner had closed its log itself."""
    if learner_closed_its_log(cfg.run_dir):
        return None
    checkpoint = latest_checkpoint(cfg.run_dir)
    from_step = read_meta(checkpoint).step if checkpoint is not None else 0
    try:
        buffer = make_buffer(cfg.buffer, consumer="learner-0")
        try:
            snapshot_t = time.time()
            entry_ids = buffer.entry_ids()
        finally:
            buffer.close()
    except Exception as err:  # noqa: BLE001 - the audit then reports what it cannot account for
        log.warning("could not list the buffer for the audit: %s", err)
        return f"the learner ended without its last records and the buffer could not be read ({err})"
    events_log = EventLog(cfg.run_dir, "learner")
    try:
        events_log.write(LearnerLost(from_step=from_step, checkpoint=str(checkpoint) if checkpoint is not None else None))
        events_log.write(FinalBuffer(entry_ids=entry_ids, snapshot_t=snapshot_t, written_by="up"))
    finally:
        events_log.close()
    return (f"the learner ended without its last records: the run continues from step {from_step} "
            f"({len(entry_ids)} entries in the buffer, recorded for the audit)")
