"""`asyncrl up --resume` from a checkpoint whose learner died between the checkpoint's rename and its
acknowledgement, on a real Redis: the entries the checkpoint names are acknowledged, not counted in N_r again
and not trained again; the rest of what that learner had read stays pending for the next one."""

from __future__ import annotations

import json

import pytest

from asyncrl.core.buffer import make_buffer
from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.core.runtime.events import read_events
from asyncrl.learner.checkpoint_index import COVERED
from asyncrl.tools.launcher import from_checkpoint
from tests.unit.test_learner_loop import group

pytestmark = pytest.mark.integration


def test_resume_acknowledges_what_the_checkpoint_holds_and_counts_only_the_rest(clean_redis, tmp_path):
    cfg = AsyncRLConfig.model_validate({
        "run_dir": str(tmp_path / "run"), "buffer": {"type": "redis", "redis_url": clean_redis},
        "sampling": {"group_size": 2}, "learner": {"batch_size": 4},
        "controller": {"state_store": "none"},
    })  # fmt: skip
    buffer = make_buffer(cfg.buffer, consumer="learner-0")
    for i in range(5):
        buffer.put(group(f"g{i}", version=1, prompt_index=i))
    delivered = [e.entry_id for e in buffer.get(5, timeout_s=1.0)]  # all read by the learner that died
    ckpt = tmp_path / "run" / "checkpoints" / "step-000002"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text(json.dumps({"step": 2, "version": 2, "data_position": 4, "saved_unix_s": 0.0}))
    (ckpt / COVERED).write_text(json.dumps({"entry_ids": delivered[:4],  # its two steps of two groups
                                             "group_ids": ["g0", "g1", "g2", "g3"]}))

    resumed = from_checkpoint(cfg, ckpt)

    assert sorted(e.entry_id for e in buffer.all_pending()) == [delivered[4]]
    # N_r: the checkpoint's 2 steps x B = 4 trajectories, plus the one group (2 trajectories) still buffered.
    assert resumed.controller.start_admitted == 2 * 4 + 2
    assert resumed.controller.start_prompt_index == 5
    [record] = [e for e in read_events(cfg.run_dir, "learner") if e["kind"] == "covered_acked"]
    assert record["acked"] == 4
    buffer.close()
