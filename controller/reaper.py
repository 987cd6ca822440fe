"""The reaper loop: declares silent replicas dead and expires overdue leases on a timer.

Every state operation also reaps lazily, so correctness does not depend on this thread; it exists so that
quota returns (and the gauges, the status page, the held requests they wake) happen on time even when no
RPC arrives.

With the reaper running, a reap is due at least every `interval_s`; a gap much longer than that means the
controller itself stood still (paused, swapped out, its VM migrated), and so did everybody's chance to reach
it. `StallDetector` measures such gaps, and the state does not count them as the replicas' silence.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger(__name__)


class Reaper:
    def __init__(self, reap, interval_s: float):
        """`reap` is a no-argument callable (`ControllerState.reap`), called every `interval_s` seconds."""
        self._reap, self.interval_s = reap, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="controller-reaper", daemon=True)

    @classmethod
    def for_timeouts(cls, reap, heartbeat_timeout_s: float, lease_ttl_s: float, lease_max_s: float = 0.0) -> Reaper:
        # A quarter of the shortest timeout keeps detection within 25 % of it; clamped to stay cheap.
        shortest = min(t for t in (heartbeat_timeout_s, lease_ttl_s, lease_max_s) if t > 0)
        interval = min(1.0, max(0.05, shortest / 4))
        return cls(reap, interval)

    def start(self) -> Reaper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._reap()
            except Exception:
                log.exception("controller reaper round failed")


class StallDetector:
    """How long the controller stood still between two reaps, beyond the reaper's interval (0 when it did not:
    a gap above `threshold_s`)."""

    def __init__(self, interval_s: float, threshold_s: float, clock=time.monotonic):
        self._interval_s, self._threshold_s, self._clock = interval_s, threshold_s, clock
        self._last = clock()

    def missed(self) -> float:
        """Seconds stood still since the previous call (each reap calls it once)."""
        now = self._clock()
        gap = now - self._last - self._interval_s
        self._last = now
        return gap if gap > self._threshold_s else 0.0
