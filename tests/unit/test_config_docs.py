"""docs/configuration.md is exactly what `asyncrl config-docs` generates, and every field is documented."""

from pathlib import Path

from asyncrl.tools.config_docs import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_configuration_reference_is_current():
    assert DOC.read_text() == render(), "docs/configuration.md is stale: asyncrl config-docs > docs/configuration.md"


def test_every_field_has_a_description():
    rows = [line for line in render().splitlines() if line.startswith("| `")]
    assert len(rows) > 100
    undocumented = [row.split("|")[1].strip() for row in rows if row.rstrip().endswith("| |")]
    assert not undocumented, undocumented
