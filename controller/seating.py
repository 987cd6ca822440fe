"""`LearnerSeating`: the part of `ControllerState` that gives the learner's seat and checks it on every
learner-only call (the seat itself and why it exists: `controller.learner_seat`). It works on the state's
books (`controller.books`, which hold the seat: it is saved with the rest of the state).
"""

from __future__ import annotations

from asyncrl.controller.books import StateBooks
from asyncrl.controller.errors import LearnerSeatTaken, LearnerSeatUnconfirmed, NotTheLearner
from asyncrl.controller.learner_seat import Answer
from asyncrl.controller.results import LearnerRegistration
from asyncrl.core.records.controller import LearnerRefused, LearnerRegistered
from asyncrl.core.wire.learner_secret import SeatProofs


class LearnerSeating:
    def __init__(self, books: StateBooks, proofs: SeatProofs):
        self._books = books
        self._proofs = proofs
        """Registrations must prove the learner secret (`asyncrl.core.wire.learner_secret`); built without a secret,
        any token holder may register (unit tests, `security.insecure`)."""

    def register_learner(self, address: str, proof_unix_s: int = 0, seat_proof: bytes = b"",
                         proof_nonce: bytes = b"") -> LearnerRegistration:  # fmt: skip
        """Give the learner's seat to the learner at `address` (`controller.learner_seat`): refused without a
        proof of the learner secret (`asyncrl.core.wire.learner_secret`), while its holder still answers its
        challenge (the challenge runs outside the lock), and while it cannot be challenged but still
        heartbeats."""
        books = self._books
        with books.cond:
            refused = self._proofs.check(address, proof_unix_s, seat_proof, proof_nonce)
            if refused:
                books.events.write(LearnerRefused(address=address, reason=refused))
                raise NotTheLearner(refused)
            holder = books.seat.holder
        answer = books.seat.challenge(holder)
        if answer is Answer.ALIVE:
            raise LearnerSeatTaken(f"address: the learner at {holder.address} holds this run's seat and still "
                                   "answers; one learner trains a run (stop that one first)")
        with books.cond:
            if books.seat.holder != holder:  # another learner registered while we challenged
                raise LearnerSeatTaken(f"address: the learner at {books.seat.holder.address} took this run's seat "
                                       "just now; one learner trains a run")
            # Its last sign of life: its last heartbeat, or taking the seat (a heartbeat from before is another's).
            now = books.clock()
            silent_s = now - max(holder.since, books.learner.at if books.learner is not None else float("-inf"))
            if answer is Answer.UNKNOWN and silent_s < books.config.heartbeat_timeout_s:
                raise LearnerSeatUnconfirmed(
                    f"address: the controller could not challenge the learner at {holder.address}, which holds "
                    f"this run's seat and was last heard from {silent_s:.1f} s ago; the seat passes once it has "
                    f"been silent for controller.heartbeat_timeout_s ({books.config.heartbeat_timeout_s:g} s): "
                    "retry then")
            key = books.seat.give_to(address, now)
            books.events.write(LearnerRegistered(address=address, previous_address=holder.address or None,
                                                 current_version=books.current_version))  # fmt: skip
            books.changed(wake=False)
            return LearnerRegistration(key, books.current_version)

    def check_learner(self, key: bytes) -> None:
        """Raise `NotTheLearner` unless `key` is the seated learner's (every learner-only call)."""
        with self._books.cond:
            self._books.seat.check(key)
