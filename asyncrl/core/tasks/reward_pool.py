"""Rewards on worker threads, bounded in time, never silently stuck.

A verifier can be slow (symbolic math) or broken (a user function that raises on some inputs). The pool
scores a batch of responses in parallel; a reward that raises or runs past `timeout_s` scores 0, adds to the
error counter, and its traceback is logged once per distinct error (type and message), so one bad sample
neither crashes the replica nor floods its log.

A call past its time-out may never return (a regex that backtracks forever, a solver in a loop), and a thread
cannot be stopped: it holds its worker for good. Once every worker is held by such a call, and none of them
returns within one more time-out, no reward can be computed any more. The pool then raises
`RewardWorkersHung` instead of scoring every later sample 0 after a time-out each (which would train on
nothing but zeros): a replica's rollout loop dies of it, and the replica exits to be restarted with fresh
threads (`rollout.runtime`); the learner's held-out evaluation fails with it (`learner.held_out`).
"""

from __future__ import annotations

import logging
import math
import threading
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from asyncrl.core.runtime.log_once import FirstOfKind
from asyncrl.core.tasks.rewards import RewardFn

log = logging.getLogger(__name__)


class RewardWorkersHung(RuntimeError):
    """Every reward worker is held by a call that ran past `reward.timeout_s` and never returned."""


class RewardPool:
    def __init__(self, fn: RewardFn, workers: int, timeout_s: float, on_error=None):
        self._fn, self._timeout_s, self._workers = fn, timeout_s, workers
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reward")
        self._stuck: set[Future] = set()
        """Calls past their time-out that were running (not merely queued) then: each holds a worker."""
        self._on_error = on_error or (lambda kind: None)
        self._logged = FirstOfKind()
        self._lock = threading.Lock()
        self.errors = 0

    def score(self, items: list[tuple[str, dict[str, Any]]]) -> list[float]:
        """Rewards of (response_text, metadata) pairs, in order. Raises `RewardWorkersHung` when no worker is
        left to compute them."""
        self._check_workers()
        futures = [self._pool.submit(self._fn, text, metadata) for text, metadata in items]
        rewards = []
        for future in futures:
            try:
                value = float(future.result(timeout=self._timeout_s))
                if not math.isfinite(value):
                    raise ValueError(f"the reward function returned {value}")
                rewards.append(value)
            except FutureTimeout:
                if not future.cancel():  # it runs, holding its worker (a queued one is simply dropped)
                    self._stuck.add(future)
                self._failed("timeout", f"reward took longer than reward.timeout_s ({self._timeout_s:g} s)")
                rewards.append(0.0)
                self._check_workers()
            except Exception as err:  # noqa: BLE001 - user code: any failure scores 0 and is counted
                detail = "".join(traceback.format_exception(type(err), err, err.__traceback__))
                self._failed(type(err).__name__, f"{type(err).__name__}: {err}", detail)
                rewards.append(0.0)
        return rewards

    def _check_workers(self) -> None:
        self._stuck = {future for future in self._stuck if not future.done()}
        if len(self._stuck) >= self._workers:
            # Slow is not hung: one more time-out for any of them to return before giving up on all.
            returned, _ = wait(self._stuck, timeout=self._timeout_s, return_when=FIRST_COMPLETED)
            self._stuck -= returned
        if len(self._stuck) >= self._workers:
            raise RewardWorkersHung(
                f"all {self._workers} reward workers (reward.workers) are held by calls that ran past "
                f"reward.timeout_s ({self._timeout_s:g} s) and never returned: the reward function hangs on some "
                "responses")

    def _failed(self, kind: str, key: str, detail: str = "") -> None:
        with self._lock:
            self.errors += 1
        self._on_error(kind)
        if self._logged.first(key):
            log.error("reward failed (scored 0; logged once per distinct error): %s\n%s", key, detail)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
