"""`asyncrl runs list|add|remove` on a deployment's run directory (`asyncrl.tools.runs_cli`): a change checked
whole is written in one rename; a change refused leaves the file byte for byte as it was."""

from __future__ import annotations

import pytest

from asyncrl.core.checks.config_error import ConfigError
from asyncrl.core.config.file import dump_config, load_config
from asyncrl.core.config.runs import run_configs
from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.tools.cli import main
from asyncrl.tools.runs_cli import add_run, list_runs, remove_run


@pytest.fixture()
def run_dir(tmp_path):
    cfg = AsyncRLConfig.model_validate({
        "run_dir": str(tmp_path), "model": {"path": "m"}, "learner": {"lora": {"enabled": True}, "total_steps": 9},
        "controller": {"port": 0, "status_port": 0}, "rollout": {"max_runs": 3},
        "runs": [{"name": "a"}, {"name": "b", "weight": 2}]})
    dump_config(cfg, tmp_path / "config.resolved.yaml")
    return tmp_path


def test_add_and_remove_write_the_runs_and_list_shows_them(run_dir, capsys):
    add_run(str(run_dir), "c", 0.5, ["learner.lr=3e-4", "task.num_digits=3"])
    remove_run(str(run_dir), "a")
    cfg = load_config(run_dir / "config.resolved.yaml")
    assert [(r.name, r.weight, r.removed) for r in cfg.runs] == [("a", 1.0, True), ("b", 2.0, False),
                                                                 ("c", 0.5, False)]
    c = run_configs(cfg)["c"]
    assert (c.learner.lr, c.task.num_digits, c.learner.total_steps) == (3e-4, 3, 9)
    assert [(r["name"], r["state"], r["step"], r["total_steps"]) for r in list_runs(str(run_dir))] == [
        ("a", "removed", 0, 9), ("b", "training", 0, 9), ("c", "training", 0, 9)]
    assert main(["runs", "list", str(run_dir)]) == 0
    assert "c                       0.5 training      0/9" in capsys.readouterr().out


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: add_run(d, "b", 1.0, []), "run 'b' cannot change"),
    (lambda d: add_run(d, "c", 1.0, ["model.path=x"]), "model: shared by every run"),
    (lambda d: add_run(d, "c", 1.0, ["learner.lora.rank=64"]), "learner.lora.rank 64 is above the 16"),
    (lambda d: add_run(d, "c", 1.0, ["learner.batch_size=7"]), r"runs\[2\] \(c\): learner.batch_size"),
    (lambda d: remove_run(d, "z"), "no active run 'z' \\(active: a, b\\)"),
])
def test_a_refused_change_leaves_the_deployment_as_it_was(run_dir, change, message):
    before = (run_dir / "config.resolved.yaml").read_bytes()
    with pytest.raises((ConfigError, ValueError), match=message):
        change(str(run_dir))
    assert (run_dir / "config.resolved.yaml").read_bytes() == before
    assert [p.name for p in run_dir.iterdir()] == ["config.resolved.yaml"]  # no temporary file left behind


def test_the_command_line_names_what_is_missing(run_dir, capsys):
    assert main(["runs", "remove", str(run_dir)]) == 2
    assert "NAME: the run to remove is required" in capsys.readouterr().err
    assert main(["runs", "list", str(run_dir / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
