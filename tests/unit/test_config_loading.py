"""A config file or `--set` that cannot be read is a config error naming `--config` or `--set`, never a
traceback (`asyncrl.core.config.file.load_config`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.core.checks.config_error import ConfigError
from asyncrl.core.config.file import load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-arith.yaml"


def test_overrides_reach_nested_fields_as_yaml_values():
    cfg = load_config(EXAMPLE, ["learner.total_steps=7", "controller.eta=0", "sampling.temperature=0.5"])
    assert (cfg.learner.total_steps, cfg.controller.eta, cfg.sampling.temperature) == (7, 0, 0.5)


def test_an_empty_file_is_every_default(tmp_path):
    (tmp_path / "empty.yaml").write_text("")
    assert load_config(tmp_path / "empty.yaml").learner.total_steps > 0


@pytest.mark.parametrize(
    ("content", "overrides", "message"),
    [
        (None, [], r"^--config: cannot read '.*missing.yaml': No such file or directory$"),
        ("learner: [\n", [], r"^--config: '.*config.yaml' is not valid YAML: .*line 2"),
        ("- learner\n", [], r"^--config: '.*config.yaml' must hold a mapping of sections, not a list$"),
        ("", ["learner.total_steps"], r"^--set: 'learner.total_steps' is not KEY=VALUE"),
        ("", ["=5"], r"^--set: '=5' is not KEY=VALUE"),
        ("", ["learner.total_steps=5", "learner.total_steps.x=1"],
         r"^--set learner.total_steps.x=1: learner.total_steps is a value, not a section$"),
        ("", ["learner.total_steps=[1"], r"^--set learner.total_steps: '\[1' is not a YAML value"),
    ],
)
def test_what_cannot_be_read_is_a_config_error_naming_the_flag(tmp_path, content, overrides, message):
    path = tmp_path / ("missing.yaml" if content is None else "config.yaml")
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_config(path, overrides)
