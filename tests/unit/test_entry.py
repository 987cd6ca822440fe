"""The `asyncrl` command's first lines find the subcommand without the parser (`asyncrl.tools.entry`): `up`
starts its fork server before anything else is imported."""

from __future__ import annotations

import pytest

from asyncrl.tools.entry import subcommand


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["up", "--config", "x.yaml"], "up"),
        (["--log-level", "WARNING", "up", "--config", "x.yaml"], "up"),
        (["--log-level", "up", "check"], "check"),  # "up" is the option's value here
        (["--log-level=DEBUG", "up"], "up"),
        (["check", "--config", "up"], "check"),
        (["--version"], None),
        ([], None),
        (["--log-level"], None),
    ],
)
def test_the_subcommand_is_the_first_word_that_is_no_global_option_or_its_value(argv, expected):
    assert subcommand(argv) == expected
