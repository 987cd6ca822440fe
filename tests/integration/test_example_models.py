"""Each example's tiny model builds from its config on first use, as `asyncrl up` builds it for a user, and its
stamp keeps it: the next `ensure_models` finds it current and builds nothing. An example whose runs in the suite
check only mechanics builds with the suite's shorter warm start (tests/conftest.py, SHORT_WARM_STARTS). Under
two workers these builds run first on the worker beside the whole-system tests (tests/conftest.py), so those
find the models built; a build already in progress is waited for (one lock per model folder), never done
twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.core.config.file import load_config
from asyncrl.tools.models_ready import ensure_models
from asyncrl.tools.tiny_model_stamp import tiny_models_current
from tests.conftest import EXAMPLE_MODELS, example_overrides

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("example", EXAMPLE_MODELS)
def test_an_example_model_builds_once_and_its_stamp_keeps_it(example, capsys):
    config = load_config(EXAMPLES / f"{example}.yaml", example_overrides(example))
    ensure_models(config)
    assert tiny_models_current(config)
    capsys.readouterr()
    ensure_models(config)
    assert "built the tiny model" not in capsys.readouterr().out
