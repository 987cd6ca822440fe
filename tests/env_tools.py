"""A tool backed by the environment server process (tests/env_server.py) at $ASYNCRL_TEST_ENV_URL."""

import json
import os
import urllib.request


def add(a: int, b: int) -> int:
    """Add two integers on the environment server.

    Args:
        a: The first addend.
        b: The second addend.
    """
    request = urllib.request.Request(os.environ["ASYNCRL_TEST_ENV_URL"] + "/add", method="POST",
                                     data=json.dumps({"a": a, "b": b}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())["sum"]
