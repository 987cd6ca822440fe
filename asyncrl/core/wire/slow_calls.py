"""Saying so while a call to another service waits: a cut link makes a gRPC call wait up to its deadline
without a word (the packets go nowhere, nothing fails), which reads as a hang. `said_if_slow` logs once when
the call has not returned after `after_s`, and again when it returns, with how long it took."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

log = logging.getLogger(__name__)

SLOW_CALL_S = 5.0
"""How long a call to another service may take before the caller says it is still waiting."""


@contextlib.contextmanager
def said_if_slow(what: str, after_s: float = SLOW_CALL_S, logger: logging.Logger = log) -> Iterator[None]:
    """Log a warning naming `what` if the block has not ended after `after_s`, and one when it ends then."""
    start = time.monotonic()
    timer = threading.Timer(after_s, logger.warning, ("%s: no answer for %g s, still waiting", what, after_s))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        took = time.monotonic() - start
        if took >= after_s:
            logger.warning("%s: ended after %.1f s", what, took)
