"""Telling the first of a repeating failure from the rest: user code (a reward, a tool, an environment) that
fails on many samples is logged once per kind, so it shows without flooding the log; the counts go to the
metrics."""

from __future__ import annotations

import threading
from collections.abc import Hashable


class FirstOfKind:
    """`first(key)`: True the first time `key` is seen, False after (thread-safe)."""

    def __init__(self):
        self._seen: set[Hashable] = set()
        self._lock = threading.Lock()

    def first(self, key: Hashable) -> bool:
        with self._lock:
            new = key not in self._seen
            self._seen.add(key)
        return new
