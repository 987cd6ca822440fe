"""Requests held without a thread, as coroutines on the gRPC server's loop: a lease request held until it is
admissible (`hold`), and the learner's wait for old leases to end (`await_lease_ends`).

A request the η rule (or the replica's missing weights) forbids waits, at most min(wait_s,
`controller.max_hold_s`), and looks again whenever the state says a held request may have become admissible
(`Admission.add_waker`: a commit, returned quota, a replica synced) or every `HOLD_POLL_S`, so an expiry
found by lazy reaping still releases it. A thousand held replicas cost a thousand small coroutines, not a
thousand threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from asyncrl.controller.admission import Admission
from asyncrl.controller.errors import ControllerStopping
from asyncrl.core.wire.grpc_aio import Wakeup

HOLD_POLL_S = 0.25
"""A held request looks again at least this often."""

Answer = TypeVar("Answer")
Look = Callable[[float, bool, bool], "Answer | None"]
"""(started, final, first) -> the answer, or None while it must wait: `started` is when the request arrived
(time.monotonic), `final` that the hold is up (a refusal then carries its reason), `first` its first look."""


async def hold(admission: Admission, wakeup: Wakeup, wait_s: float, look: Look,
               stopping: Callable[[], bool] = lambda: False) -> Answer:  # fmt: skip
    """The first answer of `look`, looking again on every wake-up until the hold is up; raises
    `ControllerStopping` when `stopping()` says the controller is shutting down. The request counts as held
    (`Admission.holding`) from its first refused look to its answer; every request's time to its answer is
    observed (`Admission.answered`), the ones granted at once too."""
    started, held = time.monotonic(), False
    deadline = started + admission.hold_limit(wait_s)
    try:
        while True:
            if stopping():
                raise ControllerStopping("the controller is stopping; ask again")
            answer = look(started, time.monotonic() >= deadline, not held)
            if answer is not None:
                return answer
            if not held:
                held = True
                admission.holding(+1)
            await wakeup.wait(max(0.0, min(deadline - time.monotonic(), HOLD_POLL_S)))
    finally:
        if held:
            admission.holding(-1)
        admission.answered(started)


async def await_lease_ends(admission: Admission, lease_ends: Wakeup, version: int, wait_s: float,
                           stopping: Callable[[], bool] = lambda: False) -> tuple[int, int]:
    """`Controller.AwaitLeases`: until no lease granted at `version` or below is active, or the hold is up
    (min(wait_s, controller.max_hold_s)), looking again whenever a lease ends (`lease_ends`, woken by
    `Admission.add_end_waker`) or every HOLD_POLL_S. Returns (leases still active, the oldest one's version)."""
    deadline = time.monotonic() + admission.hold_limit(wait_s)
    while True:
        outstanding, oldest = admission.outstanding(version)
        if outstanding == 0 or time.monotonic() >= deadline or stopping():
            return outstanding, oldest
        await lease_ends.wait(max(0.0, min(deadline - time.monotonic(), HOLD_POLL_S)))
