"""The learner's seat: which process is the run's one learner.

The access token admits every process of a run (replicas, tools, dashboards); the calls that move the run (a
weight push, the learner's heartbeat, a timeline reset) must come from the learner alone. `RegisterLearner`
gives the seat to its caller with a fresh random key, and those calls carry the key (`check`). The seat
changes hands when a learner restarts (a crash, `asyncrl up`'s supervisor, a Kubernetes pod restart); it is
refused while its holder still proves itself alive by answering a challenge under its key at its address
(`holder_alive`), so a stray process cannot take a live learner's place, and two learners cannot train one
run at once. Whoever loses the seat loses it at once: its key stops working on its next call.

`LearnerSeat` is the seat itself (pure, its probe injected); `LearnerSeating` is the part of `ControllerState`
that gives and checks it (a mixin, like `admission.Admission`: it shares the state's lock, events and store).
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from asyncrl.controller.errors import LearnerSeatTaken, NotTheLearner
from asyncrl.controller.results import LearnerRegistration
from asyncrl.core.auth import liveness_mac, new_push_key

Probe = Callable[[str, bytes], bytes]
"""(address, challenge) -> the learner's answer there (b"" when none)."""


@dataclass(frozen=True)
class Holder:
    key: bytes = b""
    address: str = ""


class LearnerSeat:
    def __init__(self, probe: Probe | None = None):
        self.holder = Holder()
        self._probe = probe
        """None: the holder is never challenged (unit tests); the seat always changes hands."""

    def holder_alive(self, holder: Holder) -> bool:
        """Whether `holder` still answers a fresh challenge under its key (a network call: outside any lock)."""
        if not holder.key or self._probe is None:
            return False
        challenge = secrets.token_bytes(32)
        return hmac.compare_digest(self._probe(holder.address, challenge), liveness_mac(holder.key, challenge))

    def give_to(self, address: str) -> bytes:
        """Seat the learner at `address` with a new key (the previous holder's key stops working)."""
        self.holder = Holder(new_push_key(), address)
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


class LearnerSeating:
    def register_learner(self, address: str) -> LearnerRegistration:
        """Give the learner's seat to the learner at `address` (`controller.learner_seat`): refused while its
        holder still answers its challenge (the challenge runs outside the lock)."""
        with self._cond:
            holder = self._seat.holder
        if self._seat.holder_alive(holder):
            raise LearnerSeatTaken(f"address: the learner at {holder.address} holds this run's seat and still "
                                   "answers; one learner trains a run (stop that one first)")
        with self._cond:
            if self._seat.holder != holder:  # another learner registered while we challenged
                raise LearnerSeatTaken(f"address: the learner at {self._seat.holder.address} took this run's seat "
                                       "just now; one learner trains a run")
            key = self._seat.give_to(address)
            self.events.write("learner_registered", address=address, previous_address=holder.address or None,
                              current_version=self._current_version)  # fmt: skip
            self._changed(wake=False)
            return LearnerRegistration(key, self._current_version)

    def check_learner(self, key: bytes) -> None:
        """Raise `NotTheLearner` unless `key` is the seated learner's (every learner-only call)."""
        with self._cond:
            self._seat.check(key)
