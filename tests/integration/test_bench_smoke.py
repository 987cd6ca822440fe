"""The quick benchmarks still run, end to end, on small inputs: a benchmark is evidence only while it runs,
and one that broke (an argument its code gained, a receiver that never joined) says nothing until someone
runs it. Each writes its JSON into a temporary results directory (`ASYNCRL_RESULTS_DIR`), never into
docs/results/. The ones that train whole demo runs (async_speedup, dash, the ablations, the chaos soak,
consumption_staleness, eval_offload, routing_replay, multi_runs, run_changes) or load vLLM (engine_throughput, update_pause) take
minutes and are left to their own runs; controller_leases takes half a minute or more."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

CASES = {
    "push_fixed_cost": (["--pushes", "3", "--replicas", "1"], ["fixed_cost_s", "controller_ordered_over_in_band",
                                            "rebuild_push_s", "push_after_rebuild_s"]),
    "weight_push": (["--mb", "8", "--trials", "1"], ["push_fraction_of_raw"]),
    "buffer_throughput": (["--groups", "40", "--trials", "1"], ["ratio_total", "ratio_total_vs_raw_protobuf"]),
    "checkpoint_stall": (["--hidden", "64", "--layers", "2", "--steps", "2", "--trials", "1"], []),
    "learner_step": (["--repeats", "2", "--warmup", "1"], []),
    "prompt_sharing": (["--repeats", "2", "--warmup", "1", "--shapes", "demo", "uneven"], []),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_benchmark_runs_and_writes_its_result(name, tmp_path):
    args, keys = CASES[name]
    env = {**os.environ, "ASYNCRL_RESULTS_DIR": str(tmp_path)}
    command = [sys.executable, str(REPO / "bench" / f"{name}.py"), *args]
    done = subprocess.run(command, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / f"{name}.json").read_text())
    assert (tmp_path / f"{name}.png").is_file()
    assert result["provenance"]["machine"]["cpus"] >= 1
    for key in keys:
        assert isinstance(result[key], float), (key, result)
