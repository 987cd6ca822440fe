"""`asyncrl up` refuses a config that cannot work before anything runs: exit code 2 and one line naming the key
and the path (no traceback, no crash loop of replicas, no demo model built in place of a typo). The files are
checked before any process starts; the task (tokenizer, prompts, reward) while the services start, which a
failing check then stops, leaving no process and no run directory behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "word-problems.yaml"


def up(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "asyncrl", "up", *args], cwd=cwd, check=False, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


@pytest.fixture(scope="module")
def base(tiny_model_dir, tmp_path_factory) -> list[str]:
    """The word-problems example pointed at an existing checkpoint, with nothing built on demand."""
    root = tmp_path_factory.mktemp("start-errors")
    return ["--config", str(EXAMPLE), "--set", "model.build_tiny=false", "--set", f"model.path={tiny_model_dir.policy}",
            "--set", "teacher.enabled=false", "--set", "learner.algo.opd.enabled=false",
            "--set", f"run_dir={root / 'run'}"]  # fmt: skip


def assert_refused(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("asyncrl up: config error: "), result.stderr
    for fragment in fragments:
        assert fragment in line, line
    assert "Traceback" not in result.stderr


def test_missing_model_path(base, tmp_path):
    assert_refused(up(*base, "--set", f"model.path={tmp_path}/no-such-model"), "model.path", "no-such-model",
                   "does not exist")  # fmt: skip
    assert not (tmp_path / "no-such-model").exists()  # and nothing was built there


def test_unknown_builtin_reward(base):
    assert_refused(up(*base, "--set", "reward.type=exact"), "reward.type", "'exact_match'")


def test_reward_file_with_a_syntax_error(base, tmp_path):
    bad = tmp_path / "reward.py"
    bad.write_text("def score(response, metadata)\n    return 1.0\n")
    assert_refused(up(*base, "--set", "reward.type=function", "--set", f"reward.function={bad}:score"),
                   "reward.function", str(bad), "syntax error", "line 1")  # fmt: skip


def test_reward_function_with_a_wrong_signature(base, tmp_path):
    bad = tmp_path / "reward.py"
    bad.write_text("def score(response):\n    return 1.0\n")
    assert_refused(up(*base, "--set", "reward.type=function", "--set", f"reward.function={bad}:score"),
                   "reward.function", "cannot be called as score(response_text, metadata)")  # fmt: skip


def test_a_task_refused_while_the_services_start_stops_them_and_leaves_nothing(base, tmp_path):
    run_dir = tmp_path / "refused-run"
    bad = tmp_path / "reward.py"
    bad.write_text("def score(response):\n    return 1.0\n")
    assert_refused(up(*base, "--set", f"run_dir={run_dir}", "--set", "reward.type=function",
                      "--set", f"reward.function={bad}:score"), "reward.function")  # fmt: skip
    assert not run_dir.exists()
    left = subprocess.run(["pgrep", "-f", str(run_dir)], check=False, capture_output=True, text=True).stdout.split()
    assert not left, f"processes of the refused run still running: {left}"


def test_dataset_without_the_named_field(base):
    assert_refused(up(*base, "--set", "task.dataset.prompt_field=question"), "task.dataset.train_files",
                   "no field 'question'")  # fmt: skip


def test_empty_dataset(base, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert_refused(up(*base, "--set", f"task.dataset.train_files=[{empty}]"), "task.dataset.train_files")


def test_existing_run_directory_without_resume(base, tmp_path):
    run_dir = tmp_path / "old-run"
    (run_dir / "events").mkdir(parents=True)
    assert_refused(up(*base, "--set", f"run_dir={run_dir}"), "run_dir", "exists", "--resume")
    assert_refused(up("--resume", str(tmp_path / "nothing-here")), "--resume", "not a run directory")


def test_routing_replay_on_a_dense_model(base):
    assert_refused(up(*base, "--set", "learner.routing_replay.mode=r3"), "learner.routing_replay.mode", "dense qwen2")
