"""The run stopped (Ctrl-C) right after the learner was killed, before a new learner got going: the learner's
steps after its last checkpoint died with it and their groups are still pending in the buffer. The audit
must count them there, and everything written since, instead of calling them lost (it did: the chaos soak,
`asyncrl.tools.soak`, found it), and a later `up --resume` trains them."""

from __future__ import annotations

import json
import signal
import time

import pytest

from asyncrl.core.runtime.events import read_events
from tests.chaos.test_kill import kill
from tests.run_helpers import demo_args, running_up, steps_done, wait_for

pytestmark = pytest.mark.chaos


def test_a_run_stopped_right_after_its_learner_died_loses_nothing(tmp_path):
    run_dir = tmp_path / "run"
    args = demo_args(run_dir, 100000, "controller.eta=4", "learner.eval_every=0", "learner.checkpoint.save_every=20")
    with running_up(*args) as proc:
        wait_for(lambda: steps_done(run_dir) >= 30, 300, "30 learner steps")
        kill(run_dir, "learner")
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        output = proc.communicate(timeout=120)[0]
    audit = json.loads((run_dir / "summary.json").read_text())["audit"]
    assert audit["intact"] and audit["failures"] == [f"the run ended at step {audit['last_step']} of 100000"], audit
    assert audit["lost"] == [] and audit["left_in_buffer"] > 0
    assert audit["groups_trained"] % 8 == 0
    if "the learner ended without its last records: the run continues from step" in output:
        assert audit["groups_trained"] // 8 % 20 == 0  # what counts as trained ends at the last checkpoint
    else:
        # `up` had already started the next learner (a fork takes well under the half second): it resumed from
        # the checkpoint (its first record; the run's first learner, starting fresh, writes none), may have
        # trained a few steps, and closed its log itself when stopped. Either way nothing may be lost.
        kinds = [e["kind"] for e in read_events(run_dir, "learner")]
        assert "resumed" in kinds, output[-2000:]
        last_start = len(kinds) - 1 - kinds[::-1].index("resumed")
        assert "final_buffer" in kinds[last_start:], output[-2000:]
