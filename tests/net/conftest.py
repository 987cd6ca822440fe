import pytest

from asyncrl.tools.netlab import why_no_lab


def pytest_collection_modifyitems(items):
    why = why_no_lab()
    for item in items:
        item.add_marker(pytest.mark.net)
        if why:
            item.add_marker(pytest.mark.skip(reason=why))
