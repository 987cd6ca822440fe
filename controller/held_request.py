"""A lease request held until it is admissible, without a thread: a coroutine on the gRPC server's loop.

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
from asyncrl.core.grpc_aio import Wakeup

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
