"""`learner.stale_groups: hold`: before each step the learner waits until no lease is still out that would fall
more than η versions behind at the next step (`Controller.AwaitLeases`), so late groups are trained in time
instead of dropped.

At version s the step trains the groups in hand, oldest first; at s + 1 a group whose oldest token is from
version s - η or older would be stale. A lease's tokens are no older than the version it was granted at, so
once every lease granted at s - η or before has ended (its group written, or its quota back at expiry), the
groups that would go stale are all in the buffer, and the oldest-first batch of step s takes them. What the
wait costs is the speed-up: the learner idles for the slowest episodes instead of dropping them
(`bench/agentic_speedup.py`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import grpc

from asyncrl.v1 import controller_pb2

log = logging.getLogger("asyncrl.learner")

WAIT_S = 2.0
"""How long one AwaitLeases call is held; the learner heartbeats between calls."""
PATIENCE_S = 120.0
"""How long the controller may stay unreachable before the error stands (it restarts in less)."""
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class StaleHold:
    def __init__(self, stub, eta: int, heartbeat: Callable[[], None], metrics):
        self._stub = stub
        self.eta = eta
        self._heartbeat = heartbeat
        """Called between waits (the controller and the status page see the learner is alive)."""
        self._metrics = metrics

    def before_step(self, version: int, stop=None) -> float:
        """Wait until no lease granted at version - η or before is active (none to wait for below η); returns
        the seconds waited. Returns early when `stop` is set; a controller that cannot be reached is waited for
        (it restarts with its leases)."""
        oldest = version - self.eta
        if oldest < 0:
            return 0.0
        started = time.perf_counter()
        request = controller_pb2.AwaitLeasesRequest(version=oldest, wait_s=WAIT_S)
        unreachable_since = None
        while not (stop is not None and stop.is_set()):
            try:
                answer = self._stub.AwaitLeases(request, timeout=WAIT_S + 30)
                unreachable_since = None
            except grpc.RpcError as err:
                unreachable_since = unreachable_since or time.monotonic()
                if err.code() not in RETRIED or time.monotonic() - unreachable_since > PATIENCE_S:
                    raise
                log.warning("waiting for the leases of version %d: %s, retrying", oldest, err.code().name)
                time.sleep(1.0)
                continue
            if answer.outstanding == 0:
                break
            self._heartbeat()
        waited = time.perf_counter() - started
        self._metrics.stale_hold_seconds.inc(waited)
        return waited
