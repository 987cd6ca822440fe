"""Rewards on worker threads, bounded in time, never fatal.

A verifier can be slow (symbolic math) or broken (a user function that raises on some inputs). The pool
scores a batch of responses in parallel; a reward that raises or runs past `timeout_s` scores 0, adds to the
error counter, and its traceback is logged once per distinct error (type and message), so one bad sample
neither crashes the replica nor floods its log.
"""

from __future__ import annotations

import logging
import math
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from asyncrl.core.rewards import RewardFn

log = logging.getLogger(__name__)


class RewardPool:
    def __init__(self, fn: RewardFn, workers: int, timeout_s: float, on_error=None):
        self._fn, self._timeout_s = fn, timeout_s
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reward")
        self._on_error = on_error or (lambda kind: None)
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self.errors = 0

    def score(self, items: list[tuple[str, dict[str, Any]]]) -> list[float]:
        """Rewards of (response_text, metadata) pairs, in order."""
        futures = [self._pool.submit(self._fn, text, metadata) for text, metadata in items]
        rewards = []
        for future in futures:
            try:
                value = float(future.result(timeout=self._timeout_s))
                if not math.isfinite(value):
                    raise ValueError(f"the reward function returned {value}")
                rewards.append(value)
            except FutureTimeout:
                self._failed("timeout", f"reward took longer than reward.timeout_s ({self._timeout_s:g} s)")
                rewards.append(0.0)
            except Exception as err:  # noqa: BLE001 - user code: any failure scores 0 and is counted
                detail = "".join(traceback.format_exception(type(err), err, err.__traceback__))
                self._failed(type(err).__name__, f"{type(err).__name__}: {err}", detail)
                rewards.append(0.0)
        return rewards

    def _failed(self, kind: str, key: str, detail: str = "") -> None:
        with self._lock:
            self.errors += 1
            first = key not in self._seen
            self._seen.add(key)
        self._on_error(kind)
        if first:
            log.error("reward failed (scored 0; logged once per distinct error): %s\n%s", key, detail)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
