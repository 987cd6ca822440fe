"""`asyncrl up` closes the learner's log when the learner could not (`asyncrl.tools.run_end`), against a real
Redis: the buffer's entries, pending ones included, and the checkpoint the run continues from."""

from __future__ import annotations

import json

import pytest

from asyncrl.core.buffer import make_buffer
from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.core.records.learner import FinalBuffer, Resumed, Step
from asyncrl.core.runtime.events import EventLog, read_events
from asyncrl.tools.run_end import close_learner_log
from asyncrl.v1 import trajectory_pb2

pytestmark = pytest.mark.integration


def config(tmp_path, redis_url) -> AsyncRLConfig:
    return AsyncRLConfig.model_validate({"run_dir": str(tmp_path), "buffer": {"redis_url": redis_url}})


def test_up_records_the_buffer_and_the_checkpoint_for_a_learner_that_died(tmp_path, clean_redis):
    cfg = config(tmp_path, clean_redis)
    buffer = make_buffer(cfg.buffer, consumer="learner-0")
    ids = [buffer.put(trajectory_pb2.TrajectoryGroup(group_id=f"g{i}")) for i in range(3)]
    delivered = buffer.get(2, timeout_s=1.0)  # the dead learner's: pending, never acknowledged
    assert [e.entry_id for e in delivered] == ids[:2]
    meta = tmp_path / "checkpoints" / "step-000004"
    meta.mkdir(parents=True)
    (meta / "meta.json").write_text(json.dumps({"step": 4, "version": 4, "data_position": 0, "saved_unix_s": 1.0}))
    log = EventLog(tmp_path, "learner")
    log.write(Resumed(from_step=0, version=0, path="model"))
    log.write(Step(step=5, version=5))
    log.close()

    line = close_learner_log(cfg)
    assert line and "continues from step 4" in line
    closing = read_events(tmp_path, "learner")[-2:]
    assert closing[0]["kind"] == "learner_lost" and closing[0]["from_step"] == 4
    assert closing[1]["kind"] == "final_buffer" and closing[1]["entry_ids"] == ids
    assert close_learner_log(cfg) is None  # closed now: nothing written twice
    buffer.close()


def test_a_learner_that_closed_its_log_is_left_alone(tmp_path, clean_redis):
    cfg = config(tmp_path, clean_redis)
    log = EventLog(tmp_path, "learner")
    log.write(Resumed(from_step=0, version=0, path="model"))
    log.write(FinalBuffer(entry_ids=[], snapshot_t=1.0))
    log.close()
    assert close_learner_log(cfg) is None
    assert len(read_events(tmp_path, "learner")) == 2
