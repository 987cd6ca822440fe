"""The learner's seat: which process is the run's one learner.

The access token admits every process of a run (replicas, tools, dashboards); the calls that move the run (a
weight push, the learner's heartbeat, a timeline reset) must come from the learner alone. `RegisterLearner`
gives the seat to its caller with a fresh random key, and those calls carry the key (`check`). The seat
changes hands when a learner restarts (a crash, `asyncrl up`'s supervisor, a Kubernetes pod restart); it is
refused while its holder still proves itself alive by answering a challenge under its key at its address
(`challenge`), so a stray process cannot take a live learner's place, and two learners cannot train one
run at once. Whoever loses the seat loses it at once: its key stops working on its next call.

When the challenge gets no answer either way (a time-out, a firewall, a TLS certificate that does not name the
address) the seat does not fall open: it stays with a holder that sent its `LearnerHeartbeat` within
`controller.heartbeat_timeout_s`, and the caller is told to retry (UNAVAILABLE). A crashed learner stops
heartbeating, so its successor gets the seat at most that long after the crash; one that comes back where
the controller reaches it gets the seat at once (the old key no longer answers there).

`LearnerSeat` is the seat itself (pure, its probe injected); `controller.seating.LearnerSeating` is the part of
`ControllerState` that gives and checks it.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Callable
from dataclasses import dataclass

from asyncrl.controller.errors import NotTheLearner
from asyncrl.core.wire.auth import answers_challenge, new_push_key

Probe = Callable[[str, bytes], "bytes | None"]
"""(address, challenge) -> the learner's answer there: b"" when something answered without the key or nothing
listens there (the connection was refused), None when no answer came at all (it may live, unreachable)."""


class Answer(enum.Enum):
    ALIVE = "alive"
    """The holder answered under its key."""
    GONE = "gone"
    """Something answered without the key, or nothing listens at the holder's address."""
    UNKNOWN = "unknown"
    """No answer came (time-out, unreachable): the holder may still live."""


@dataclass(frozen=True)
class Holder:
    key: bytes = b""
    address: str = ""
    since: float = float("-inf")
    """State clock time it took the seat (-inf: restored from a saved state)."""


class LearnerSeat:
    def __init__(self, probe: Probe | None = None):
        self.holder = Holder()
        self._probe = probe
        """None: the holder is never challenged (unit tests); the seat always changes hands."""

    def challenge(self, holder: Holder) -> Answer:
        """Whether `holder` still answers a fresh challenge under its key (a network call: outside any lock)."""
        if not holder.key or self._probe is None:
            return Answer.GONE
        proved = answers_challenge(self._probe, holder.address, holder.key)
        return Answer.UNKNOWN if proved is None else Answer.ALIVE if proved else Answer.GONE

    def give_to(self, address: str, now: float) -> bytes:
        """Seat the learner at `address` with a new key (the previous holder's key stops working)."""
        self.holder = Holder(new_push_key(), address, now)
        return self.holder.key

    def restore(self, key: bytes, address: str) -> None:
        self.holder = Holder(key, address)

    def check(self, key: bytes) -> None:
        """Raise `NotTheLearner` unless `key` is the seated learner's."""
        if not self.holder.key:
            raise NotTheLearner("learner_key: no learner holds this run's seat; the learner calls RegisterLearner "
                                "first")
        if not key:
            raise NotTheLearner("learner_key: missing; only the learner holding the run's seat (RegisterLearner) "
                                "may make this call")
        if not hmac.compare_digest(key, self.holder.key):
            raise NotTheLearner(f"learner_key: not the key of the learner holding the run's seat (now the learner "
                                f"at {self.holder.address}); another learner took the seat over")
