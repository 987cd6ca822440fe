"""Crashes on one CUDA GPU, as `asyncrl up` rides them: the learner killed after a checkpoint comes back on the
GPU from it (model and optimizer state restored into CUDA tensors, the run taken back to the checkpoint's
version), and a replica whose CUDA engine is killed comes back and is resynced from the CUDA learner. The
run completes every step, the audit is clean, and the checkpoint's weights evaluate the same after the
restart as before it. The CPU tier kills the same services on CPUs (tests/chaos/test_kill.py).

Skipped without CUDA.
"""

from __future__ import annotations

import pytest
import torch

from asyncrl.core.records.learner import Eval, Step
from asyncrl.core.runtime.events import read_events, read_records
from asyncrl.tools.audit import surviving
from tests.chaos.test_kill import checkpoint_of_step, kill, surviving_steps
from tests.gpu.test_system_gpu import ON_GPU
from tests.run_helpers import demo_args, running_up, wait_for

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

STEPS, SAVE_EVERY = 60, 20


def test_a_cuda_learner_and_a_cuda_replica_killed_mid_run_come_back_on_the_gpu(tmp_path):
    run_dir = tmp_path / "run"
    args = demo_args(run_dir, STEPS, f"learner.eval_every={SAVE_EVERY}",
                     f"learner.checkpoint.save_every={SAVE_EVERY}", *ON_GPU)
    with running_up(*args) as proc:
        wait_for(lambda: surviving_steps(run_dir) >= SAVE_EVERY + 5 and checkpoint_of_step(run_dir, SAVE_EVERY),
                 600, f"{SAVE_EVERY + 5} steps and the checkpoint of step {SAVE_EVERY}")
        kill(run_dir, "learner")  # a few steps past its checkpoint: they are trained again from it
        wait_for(lambda: any(e["kind"] == "resumed" for e in read_events(run_dir, "learner")), 300, "the restart")
        wait_for(lambda: surviving_steps(run_dir) >= 35, 300, "35 steps on the surviving timeline")
        kill(run_dir, "rollout")
        out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-5000:]
    assert "[up] audit OK" in out, out[-3000:]
    for restart in ("restarting it from its checkpoint", "rollout-0 exited"):
        assert restart in out, (restart, out[-3000:])
    learner = read_events(run_dir, "learner")
    assert [e["from_step"] for e in learner if e["kind"] == "resumed"] == [SAVE_EVERY]
    timeline = surviving(read_records(run_dir, "learner"))
    assert [e.step for e in timeline if isinstance(e, Step)] == list(range(1, STEPS + 1))
    evals = [e for e in learner if e["kind"] == "eval"]
    at_checkpoint = [e["accuracy"] for e in evals if e["step"] == SAVE_EVERY]
    assert len(at_checkpoint) == 2 and at_checkpoint[0] == at_checkpoint[1], at_checkpoint
    final = [e for e in timeline if isinstance(e, Eval)][-1].accuracy
    print(f"gpu restarts: accuracy {evals[0]['accuracy']:.3f} -> checkpoint {at_checkpoint[0]:.3f} -> final "
          f"{final:.3f}; {next(line for line in out.splitlines() if '[up] audit' in line)}")
