"""`asyncrl up` with a two-rank learner (FSDP2 over gloo, started by torchrun): it trains the demo, every
version reaches both replicas, the audit is clean, its checkpoints hold one shard file per rank plus the
gathered Hugging Face export; the run then resumes from them on one rank (`up --resume`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from asyncrl.core.runtime.events import read_events
from tests.e2e.test_system import REPO, asyncrl_up, no_process_left

pytestmark = pytest.mark.e2e

STEPS = 40


def test_two_rank_learner_trains_pushes_to_every_replica_and_resumes_on_one(tmp_path):
    run_dir = tmp_path / "run"
    summary = asyncrl_up(run_dir, "learner.world_size=2", f"learner.total_steps={STEPS}",
                         "learner.eval_every=0", f"learner.checkpoint.save_every={STEPS // 2}", timeout_s=600)
    audit = summary["audit"]
    assert audit["ok"] and audit["groups_trained"] == STEPS * 8, audit
    assert "starting 2 ranks with torchrun" in (run_dir / "logs" / "learner.log").read_text()
    # Both checkpoints were written in the background by both ranks (learner.checkpoint.background).
    saved = [e for e in read_events(run_dir, "learner") if e["kind"] == "checkpoint_saved"]
    assert [(e["step"], e["background"]) for e in saved] == [(STEPS // 2, True), (STEPS, True)], saved
    # One learner to the rest of the system: every version committed and acked by both replicas.
    pushes = [e for e in read_events(run_dir, "controller") if e["kind"] == "push_committed"]
    assert {e["version"] for e in pushes if len(e["acked"]) == 2} >= set(range(1, STEPS + 1)), pushes[-3:]
    latest = run_dir / "checkpoints" / f"step-{STEPS:06d}"
    assert sorted(p.name for p in (latest / "learner").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert (latest / "hf" / "model.safetensors").is_file()
    no_process_left(run_dir)

    # The same run continues on one rank from the two ranks' checkpoint.
    resumed = subprocess.run(
        [sys.executable, "-m", "asyncrl", "up", "--resume", str(run_dir), "--set", "learner.world_size=1",
         "--set", f"learner.total_steps={STEPS + 10}"],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "[up] audit OK" in resumed.stdout, resumed.stdout[-3000:]
    events = [e for e in read_events(run_dir, "learner")]
    assert any(e["kind"] == "resumed" and e["from_step"] == STEPS for e in events)
    assert max(e["step"] for e in events if e["kind"] == "step") == STEPS + 10
    assert json.loads((run_dir / "summary.json").read_text())["audit"]["ok"]
    no_process_left(run_dir)
