"""A line a service prints for whoever started it (`asyncrl-learner run a listening grpc=... metrics=...`):
`up`, tests and operators read its ports from it, so it must arrive whole."""

from __future__ import annotations

import sys


def announce(line: str) -> None:
    """Write `line` and its newline to stdout in one write, flushed. `print` writes the text and its end apart, and
    unbuffered (PYTHONUNBUFFERED) another thread's log line lands between them: a printed port ran into a
    timestamp ("metrics=127.0.0.1:404252026-12-07 ...")."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
