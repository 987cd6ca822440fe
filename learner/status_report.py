"""The learner's reports to the controller: where it is (step, version, the figures its status page shows)
and, in the answer, whether replicas lag behind and need a resync push.

While the learner waits for data it reports in line (`now`). After a step the report goes on a thread of its
own (`after_step`) with the buffer gauges, so the step does not wait for two Redis round trips and an RPC. It
goes at most once per `learner.status_interval_s`: a step that ends sooner after the last report leaves its
figures for a report that waits out the rest of the interval and then sends the newest figures there are. So
the status page is never more than an interval (and one RPC) behind the learner, however long its next step
takes, and reports one every few steps at 20 steps a second, for a fraction of the CPU the training shares its
cores with. A failed report raises at the next step, as it would have in line; a resync asked for in the
background is taken by the loop between steps (`take_sync_request`); `finish` always reports the last step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import grpc

from asyncrl.core.wire.slow_calls import said_if_slow
from asyncrl.v1 import controller_pb2

log = logging.getLogger("asyncrl.learner")


def heartbeat_request(progress, total_steps: int) -> controller_pb2.LearnerHeartbeatRequest:
    """The heartbeat for `progress` (a `LearnerProgress`): figures only once there are some."""
    return controller_pb2.LearnerHeartbeatRequest(step=progress.step, version=progress.version,
                                                  consumed=progress.consumed, total_steps=total_steps,
                                                  figures=progress.figures())


class StatusReporter:
    def __init__(self, controller_stub, total_steps: int, observe_gauges: Callable[[], None],
                 interval_s: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self._stub = controller_stub
        self._total_steps = total_steps
        self._observe_gauges = observe_gauges
        """Reads the buffer's depth into the learner's gauges (a Redis round trip or two)."""
        self._interval_s, self._clock, self._sleep = interval_s, clock, sleep
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="status")
        self._sent: Future | None = None
        """The report waiting out the interval or on its way (one at a time)."""
        self._sent_at = -float("inf")
        self._latest: controller_pb2.LearnerHeartbeatRequest | None = None
        """The newest figures, taken by the next report that goes out."""
        self._sync_requested = False
        self._lock = threading.Lock()
        """Guards `_latest` and `_reporting`: figures never wait behind a report that is ending."""
        self._reporting = False
        """Whether the status thread is reporting (or waiting out the interval to)."""

    def now(self, progress) -> bool:
        """Report in line; True when the controller asks for a resync push."""
        with said_if_slow("the controller's LearnerHeartbeat", logger=log):
            return self._stub.LearnerHeartbeat(heartbeat_request(progress, self._total_steps), timeout=30).sync_requested

    def after_step(self, progress) -> None:
        """Report the step just finished in the background: at once when the last report went out at least the
        interval ago, else once it has; a report already waiting or on its way takes these figures instead
        when it has not sent yet (the next one does otherwise)."""
        if self._sent is not None and self._sent.done():
            sent, self._sent = self._sent, None
            sent.result()  # a report that failed raises here
        with self._lock:
            self._latest = heartbeat_request(progress, self._total_steps)
            if not self._reporting:
                self._reporting = True
                self._sent = self._thread.submit(self._send_latest)

    def take_sync_request(self) -> bool:
        """Whether a background report's answer asked for a resync push (once)."""
        asked, self._sync_requested = self._sync_requested, False
        return asked

    def finish(self, progress) -> None:
        """Wait for the report on its way, then send the last figures (the page shows the final step). Best
        effort: the run is ending, and what follows (the final evaluation and checkpoint) matters more."""
        with self._lock:
            self._latest = None  # superseded by the last figures: a report still waiting sends nothing
        try:
            if self._sent is not None:
                self._sent.result()
            self._send(heartbeat_request(progress, self._total_steps))
        except grpc.RpcError as err:
            log.warning("final status report not sent: %s", err.details())
        finally:
            self._sent = None

    def _send_latest(self) -> None:
        """(Status thread) Wait out the rest of the interval, report the newest figures; again while steps
        have ended meanwhile. Ends, under the lock, when nothing newer came: `after_step` then starts anew."""
        try:
            while True:
                wait_s = self._sent_at + self._interval_s - self._clock()
                if wait_s > 0:
                    self._sleep(wait_s)
                with self._lock:
                    request, self._latest = self._latest, None
                    if request is None:
                        self._reporting = False
                        return
                self._sent_at = self._clock()
                self._send(request)
        except BaseException:
            with self._lock:
                self._reporting = False
            raise

    def _send(self, request) -> None:
        try:
            self._observe_gauges()
        except Exception as err:  # noqa: BLE001 - a gauge must never stop the learner (Redis reconnecting, say)
            log.warning("buffer depth not read: %s: %s", type(err).__name__, err)
        with said_if_slow("the controller's LearnerHeartbeat", logger=log):
            reply = self._stub.LearnerHeartbeat(request, timeout=30)
        if reply.sync_requested:
            self._sync_requested = True
