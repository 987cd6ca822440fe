"""A short chaos soak (`asyncrl.tools.soak`): for 30 s a random role of a running demo, sometimes two, is
killed with SIGKILL or paused for 1-4 s every 2-10 s. The learner must take steps again after every fault, and
the audit must find nothing lost, nothing trained twice and η held. The fault schedule is seeded; when they
land relative to pushes, checkpoints and leases is not, which is the point."""

from __future__ import annotations

import pytest

from asyncrl.tools.soak import soak
from tests.run_helpers import REPO

pytestmark = pytest.mark.chaos


def test_random_kills_and_pauses_never_wedge_the_run_nor_lose_data(tmp_path):
    report = soak(str(REPO / "examples" / "tiny-arith.yaml"), tmp_path / "run",
                  ["controller.eta=4", "learner.eval_every=0", "learner.checkpoint.save_every=50"],
                  calm_s=5, chaos_s=30, seed=7, wedge_s=90)
    assert report["wedged"] is None, report["fault_log"]
    assert report["faults"] >= 3, report
    assert all(f["recovered_s"] is not None for f in report["fault_log"])
    assert report["audit_ok"], report["audit"]
    assert report["chaos_steps_per_s"] > 0
