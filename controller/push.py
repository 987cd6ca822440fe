"""One weight push in flight: the plan, the receivers in rank order, and the fan-out threads' outcomes.

`ControllerState.begin_push` builds a `PushSession` and starts it; every receiver gets a background thread
that calls the injected `WeightNotifier` (in production `controller.fanout.grpc_update_weights`, i.e.
`Rollout.UpdateWeights(plan, rank)`), which returns once the replica has joined the broadcast and loaded the
weights. `CommitWeightPush` then calls `wait` *outside* the state lock, so lease traffic keeps flowing while
the learner's commit waits for the slowest receiver.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from asyncrl.core.weights.plan import PushPlan

WeightNotifier = Callable[[str, PushPlan, int, float], int]
"""(address, plan, rank, timeout_s) -> weight version the replica now holds; raises on failure."""

NEW = "new"
"""A push of version current+1 to every live replica."""
RESYNC = "resync"
"""A push of the current version to the live replicas that need it."""


@dataclass(frozen=True)
class Receiver:
    replica_id: str
    address: str
    rank: int


@dataclass(frozen=True)
class Outcome:
    ok: bool
    error: str
    seconds: float
    unreachable: bool = False
    """The replica could not be reached at all (its process is gone): treat it as dead right away."""


class PushSession:
    def __init__(
        self,
        plan: PushPlan,
        mode: str,
        receivers: list[Receiver],
        begun_at: float,
        notify: WeightNotifier,
        call_timeout_s: float,
    ):
        self.plan, self.mode, self.receivers, self.begun_at = plan, mode, receivers, begun_at
        self._notify, self._call_timeout_s = notify, call_timeout_s
        self._done = threading.Condition()
        self._outcomes: dict[str, Outcome] = {}
        self.commit_started = False
        """Set (under the state lock) by the first CommitWeightPush, so a duplicate commit is refused."""

    @property
    def push_id(self) -> str:
        return self.plan.push_id

    def start(self) -> None:
        """Fan out: one daemon thread per receiver (a hung replica must not keep the process alive)."""
        for receiver in self.receivers:
            name = f"push-{self.plan.version}-rank{receiver.rank}"
            threading.Thread(target=self._deliver, args=(receiver,), name=name, daemon=True).start()

    def wait(self, timeout_s: float) -> dict[str, Outcome]:
        """Outcomes of all receivers, waiting up to `timeout_s` for the stragglers (they count as failed)."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._done:
            while len(self._outcomes) < len(self.receivers):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._done.wait(remaining)
            outcomes = dict(self._outcomes)
        for receiver in self.receivers:
            outcomes.setdefault(
                receiver.replica_id, Outcome(False, f"no acknowledgement within {timeout_s:.1f} s", timeout_s)
            )
        return outcomes

    def outcomes_so_far(self) -> dict[str, Outcome]:
        with self._done:
            return dict(self._outcomes)

    def _deliver(self, receiver: Receiver) -> None:
        start = time.monotonic()
        unreachable = False
        try:
            version = self._notify(receiver.address, self.plan, receiver.rank, self._call_timeout_s)
            ok = version == self.plan.version
            error = "" if ok else f"replica reports version {version} after a push of {self.plan.version}"
        except Exception as err:  # noqa: BLE001 - any failure of one receiver drops just that receiver
            ok, error = False, f"{type(err).__name__}: {err}"
            unreachable = bool(getattr(err, "unreachable", False))
        with self._done:
            self._outcomes[receiver.replica_id] = Outcome(ok, error, time.monotonic() - start, unreachable)
            self._done.notify_all()
